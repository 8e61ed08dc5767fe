"""Networks of the papers, one file per paper, and the registry of named models."""
