"""Input embedding: restype one-hot and AF3's relative position encoding (AF3 SI Alg 1 lines 1-4, Alg 3)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

N_RESTYPES = 21                                   # 20 amino acids + UNK (index 20)


class RelativePositionEncoding(nn.Module):
    """Relative position encoding of token pairs (AF3 SI Alg 3).

    Within a chain: clipped residue offset (2 r_max + 1 bins) and, for tokens of one residue, clipped token offset;
    between chains: a "different chain" bin. Between tokens of one entity: the clipped offset of their chains'
    sym_id (2 s_max + 1 bins; 0 within a chain); between entities: one more bin. Plus a same-entity bit. One token
    per residue here, so the token index is the residue index. The concatenated one-hots go through one
    LinearNoBias to c_z.

    The SI's Alg 3 line 8 tests ``b_same_chain`` for the sym_id offset; AF3's released code
    (``featurization.create_relative_encoding``), Boltz and OpenFold3 test the same entity, which is what makes the
    offset mean something (the copies of one entity are numbered by sym_id); we follow the code.

    Parameters
    ----------
    c_z : output channels; r_max : residue offset clip (AF3: 32); s_max : chain offset clip (AF3: 2)
    """

    def __init__(self, *, c_z: int, r_max: int = 32, s_max: int = 2) -> None:
        super().__init__()
        self.r_max, self.s_max = r_max, s_max
        self.n_features = 2 * (2 * r_max + 2) + 1 + (2 * s_max + 2)
        self.linear = nn.Linear(self.n_features, c_z, bias=False)

    def features(self, residue_index: torch.Tensor, asym_id: torch.Tensor, entity_id: torch.Tensor,
                 sym_id: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[B, N] each -> one-hot features [B, N, N, n_features] in ``dtype``: the residue offset (2 r_max + 2
        bins), the token offset (2 r_max + 2), the same-entity bit, the chain offset (2 s_max + 2), written into one
        zero tensor (no integer one-hots: at N = 2,000 those took 4x the memory of a float32 pair tensor)."""
        r_max, s_max = self.r_max, self.s_max
        pair = lambda x: x[:, :, None] - x[:, None, :]                        # noqa: E731  [B, N, N]
        same_chain = pair(asym_id) == 0
        same_residue = pair(residue_index) == 0
        same_entity = pair(entity_id) == 0
        d_residue = torch.where(same_chain, (pair(residue_index) + r_max).clamp(0, 2 * r_max), 2 * r_max + 1)
        d_token = torch.where(same_chain & same_residue, (pair(residue_index) + r_max).clamp(0, 2 * r_max),
                              2 * r_max + 1)
        d_chain = torch.where(same_entity, (pair(sym_id) + s_max).clamp(0, 2 * s_max), 2 * s_max + 1)
        bins = 2 * r_max + 2
        feats = torch.zeros(*same_chain.shape, self.n_features, dtype=dtype, device=same_chain.device)
        feats.scatter_(-1, d_residue[..., None], 1.0)
        feats.scatter_(-1, bins + d_token[..., None], 1.0)
        feats[..., 2 * bins] = same_entity.to(dtype)
        feats.scatter_(-1, 2 * bins + 1 + d_chain[..., None], 1.0)
        return feats

    def forward(self, residue_index: torch.Tensor, asym_id: torch.Tensor, entity_id: torch.Tensor,
                sym_id: torch.Tensor) -> torch.Tensor:
        """[B, N] each -> p [B, N, N, c_z]."""
        device = residue_index.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else self.linear.weight.dtype
        return self.linear(self.features(residue_index, asym_id, entity_id, sym_id, dtype))


class InputEmbedder(nn.Module):
    """Initial single and pair representations (AF3 SI Alg 1, lines 1-4), single sequence, protein only.

    s_inputs = one_hot(restype); s_init = LinearNoBias(s_inputs);
    z_init = LinearNoBias(s_inputs)_i + LinearNoBias(s_inputs)_j + RelativePositionEncoding.

    Parameters
    ----------
    c_s, c_z : single and pair channels
    """

    def __init__(self, *, c_s: int, c_z: int) -> None:
        super().__init__()
        self.c_inputs = N_RESTYPES
        self.linear_s = nn.Linear(N_RESTYPES, c_s, bias=False)
        self.linear_z_i = nn.Linear(N_RESTYPES, c_z, bias=False)
        self.linear_z_j = nn.Linear(N_RESTYPES, c_z, bias=False)
        self.relpos = RelativePositionEncoding(c_z=c_z)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """batch with restype, residue_index, asym_id, entity_id, sym_id [B, N] -> s_inputs [B, N, 21],
        s_init [B, N, c_s], z_init [B, N, N, c_z]."""
        restype = batch["restype"]
        if restype.is_cuda:     # checked on the device: a host check would wait for the GPU at every step
            torch._assert_async(((restype >= 0) & (restype < N_RESTYPES)).all(),
                                f"restype must be in 0..{N_RESTYPES - 1}")
        elif restype.min() < 0 or restype.max() >= N_RESTYPES:
            raise ValueError(f"restype must be in 0..{N_RESTYPES - 1}, got values in "
                             f"{int(restype.min())}..{int(restype.max())}")
        s_inputs = F.one_hot(restype, N_RESTYPES).to(self.linear_s.weight.dtype)
        s_init = self.linear_s(s_inputs)
        z_init = self.linear_z_i(s_inputs)[:, :, None] + self.linear_z_j(s_inputs)[:, None, :]
        z_init = z_init + self.relpos(batch["residue_index"], batch["asym_id"], batch["entity_id"], batch["sym_id"])
        return s_inputs, s_init, z_init
