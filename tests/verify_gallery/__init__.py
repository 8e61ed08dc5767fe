"""Third-party-style modules for the verify tool's tests: written as someone else would, not as our twins."""
