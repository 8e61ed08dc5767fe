"""PyTorch twin of refimpl.models.lisanet: LiSANet-I-T and LiSANet-H-T/S/B (Kim et al., LiSA paper, §5.1,
Table 2, Table 7, Table 8).

Patch embeddings (``patch_embed.i``: a convolution, then LayerNorm for the hierarchical models or + the
position embedding for the isotropic one), ``stages`` of LiSA blocks (refimpl.twins.modules.lisa.LiSABlock,
the LiSA helper's twin, built for each stage's token grid; with cfg.operator != "lisa" the Table 3b operator's
twin - SelfAttention or StructureAwareAttention -, Table 3c's LocalLiSAAttention or Table 3a's ConvOperator in an
OperatorBlock), final
LayerNorm, average pooling,
Linear head.
state_dict keys equal refimpl.models.lisanet.param_shapes; unit values (``run_unit``) are channels-first
grids, as in the reference.
"""

from __future__ import annotations

import torch
from torch import nn

from refimpl.twins.modules.lisa import ConvOperator, LiSABlock, LocalLiSAAttention, OperatorBlock, SelfAttention, \
    StructureAwareAttention
from refimpl.models.lisanet import LiSANetConfig, block_config, stage_grids, unit_names, unit_parts

CONFIG_TYPES = (LiSANetConfig,)

__all__ = ["CONFIG_TYPES", "build", "LiSANet", "PatchEmbed"]


class PatchEmbed(nn.Module):
    """conv (kernel, stride, padding) then, for hierarchical models, LayerNorm over channels; (B, C, H, W) in
    and out."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, padding: int, norm_eps: float | None):
        """The conv (``kernel``, ``stride``, ``padding``) cin -> cout and, when ``norm_eps`` is given
        (hierarchical models), the LayerNorm over its output channels."""
        super().__init__()
        self.proj = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding)
        if norm_eps is not None:
            self.norm = nn.LayerNorm(cout, eps=norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The conv of x (B, cin, H, W), then the LayerNorm over channels if there is one; returns (B, cout, H', W')."""
        x = self.proj(x)
        if hasattr(self, "norm"):
            x = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return x


def _geometry(cfg: LiSANetConfig, i: int) -> tuple[int, int, int]:
    if cfg.kind == "isotropic":
        return cfg.patch_size, cfg.patch_size, 0
    if cfg.embed == "overlap":
        return (7, 4, 3) if i == 0 else (3, 2, 1)
    return (4, 4, 0) if i == 0 else (2, 2, 0)


#: refimpl.models.lisanet.OPERATORS -> the twin's operator (LiSA Table 3b); "sa_eq5" is computed through the
#: attention A = Qb Kb^T (Eq. 5's first line; the reference takes the second, Fig. 6's Kb Ra route).
_SA_FORMS = {"sa_eq4": "eq4", "sa_eq5": "eq5", "sa_eq5_bias": "eq5_bias", "sa_eq7": "eq7"}


def _block(cfg: LiSANetConfig, bc) -> nn.Module:
    """One block of the stage whose LiSAConfig is ``bc``, with the operator of cfg.operator."""
    if cfg.operator == "lisa":
        return LiSABlock(bc.dim, bc.num_heads, bc.grid, bc.latent, mlp_ratio=bc.mlp_ratio, ln_eps=bc.ln_eps,
                         exact_toeplitz=bc.exact_toeplitz, fft_lengths=bc.fft_lengths, transform=bc.transform,
                         qkv_bias=bc.qkv_bias, l2_eps=bc.l2_eps)
    if cfg.operator in ("dwconv", "gf"):
        attn = ConvOperator(bc.dim, bc.grid, cfg.operator)
    elif cfg.operator == "lisa_local":
        attn = LocalLiSAAttention(bc.dim, bc.num_heads, bc.grid, bc.latent, kernel=cfg.local_kernel,
                                  qkv_bias=bc.qkv_bias, l2_eps=bc.l2_eps)
    elif cfg.operator in ("selfattn", "selfattn_rpe"):
        rpe = None if cfg.operator == "selfattn" else ("per_head" if cfg.rpe_per_head else "shared")
        attn = SelfAttention(bc.dim, bc.num_heads, bc.grid, rpe=rpe, qkv_bias=bc.qkv_bias)
    else:
        attn = StructureAwareAttention(bc.dim, bc.num_heads, bc.grid, bc.latent, form=_SA_FORMS[cfg.operator],
                                       rpe="toeplitz", rpe_per_head=cfg.rpe_per_head, qkv_bias=bc.qkv_bias,
                                       l2_eps=bc.l2_eps)
    return OperatorBlock(bc.dim, attn, mlp_ratio=bc.mlp_ratio, ln_eps=bc.ln_eps)


class LiSANet(nn.Module):
    """forward(images) -> logits; features(images) -> [stage outputs (B, C_i, H_i, W_i)]; run_unit(name, x)."""

    def __init__(self, cfg: LiSANetConfig):
        """Per stage the patch embedding (isotropic: stride patch_size; hierarchical: overlapping 7/4/3 then 3/2/1
        convs, or kernel = stride patches, each with a LayerNorm) and its blocks with ``cfg.operator``; the isotropic
        positional embedding when pos_embed; the final LayerNorm and the head."""
        super().__init__()
        self.cfg = cfg
        grids = stage_grids(cfg, cfg.image_size)
        self.patch_embed = nn.ModuleList()
        self.stages = nn.ModuleList()
        hier = cfg.kind == "hierarchical"
        for i in range(cfg.num_stages):
            k, s, p = _geometry(cfg, i)
            cin = cfg.in_chans if i == 0 else cfg.dims[i - 1]
            self.patch_embed.append(PatchEmbed(cin, cfg.dims[i], k, s, p, cfg.ln_eps if hier else None))
            bc = block_config(cfg, i)
            self.stages.append(nn.ModuleList(_block(cfg, bc) for _ in range(cfg.depths[i])))
        if not hier and cfg.pos_embed:
            self.pos_embed = nn.Parameter(torch.zeros(1, grids[0][0] * grids[0][1], cfg.dims[0]))
        self.norm = nn.LayerNorm(cfg.dims[-1], eps=cfg.ln_eps)
        self.head = nn.Linear(cfg.dims[-1], cfg.num_classes)

    def _embed(self, i: int, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed[i](x)
        if i == 0 and hasattr(self, "pos_embed"):
            b, c, h, w = x.shape
            x = (x.flatten(2).transpose(1, 2) + self.pos_embed).transpose(1, 2).reshape(b, c, h, w)
        return x

    def _block(self, i: int, j: int, x: torch.Tensor, part: str | None = None) -> torch.Tensor:
        b, c, h, w = x.shape
        blk = self.stages[i][j]
        tok = x.flatten(2).transpose(1, 2)
        t = blk(tok) if part is None else blk.part(part, tok)
        return t.transpose(1, 2).reshape(b, c, h, w)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x.flatten(2).transpose(1, 2)).mean(dim=1))

    def run_unit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """The unit ``name`` of refimpl.models.lisanet.unit_names (channels-first grids; images for
        "patch_embed.0")."""
        if name not in unit_names(self.cfg):
            raise ValueError(f"argument 'name': expected a unit of refimpl.models.lisanet.unit_names, got {name!r}")
        if name == "head":
            return self._head(x)
        parts = name.split(".")
        if parts[0] == "patch_embed":
            return self._embed(int(parts[1]), x)
        return self._block(int(parts[1]), int(parts[2]), x)

    def run_unit_part(self, name: str, part: str, x: torch.Tensor) -> torch.Tensor:
        """Part ``part`` ("attn" or "mlp": refimpl.models.lisanet.unit_parts) of the block unit ``name``
        ("stages.i.j") on a channels-first grid."""
        parts = unit_parts(self.cfg, name)
        if part not in parts:
            raise ValueError(f"argument 'part': unit {name!r} has parts {parts}, got {part!r}")
        p = name.split(".")
        return self._block(int(p[1]), int(p[2]), x, part)

    def features(self, images: torch.Tensor) -> list[torch.Tensor]:
        """The reference's ``features``: each stage's output grid, channels-first (B, C_i, H_i, W_i)."""
        x, feats = images, []
        for i in range(self.cfg.num_stages):
            x = self._embed(i, x)
            for j in range(len(self.stages[i])):
                x = self._block(i, j, x)
            feats.append(x)
        return feats

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (B, num_classes) of images (B, in_chans, H, W): the last stage's tokens normalised, averaged, through
        the head."""
        return self._head(self.features(images)[-1])


def build(cfg: LiSANetConfig) -> nn.Module:
    """The twin of a LiSANet config (sized for cfg.image_size: the LiSA kernels live on its token grids)."""
    if not isinstance(cfg, LiSANetConfig):
        raise TypeError(f"argument 'cfg': expected LiSANetConfig, got {type(cfg).__name__}")
    return LiSANet(cfg)
