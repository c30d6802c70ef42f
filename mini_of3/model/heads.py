"""Output heads: the distogram (AF3 SI 4.4) and a slim pLDDT head (AF3 SI 4.3, Alg 31)."""
from __future__ import annotations

import torch
from torch import nn

from mini_of3.model.norm import LayerNorm
from mini_of3.model.transition import Transition


def bin_boundaries(n_bins: int, d_min: float, d_max: float, device=None) -> torch.Tensor:
    """The n_bins - 1 inner boundaries of n_bins equal-width bins on [d_min, d_max]; the outer bins are open.

    64 bins on 2-22 A give boundaries 2.3125, 2.625, ..., 21.6875 (bin width 0.3125 A).
    """
    return torch.linspace(d_min, d_max, n_bins + 1, device=device)[1:-1]


class DistogramHead(nn.Module):
    """Distogram logits from the pair track: Linear(z_ij + z_ji), symmetric in i and j (AF3 SI 4.4).

    Trained against Cbeta distances (Calpha for glycine) in 64 bins on 2-22 A.
    """

    def __init__(self, *, c_z: int, n_bins: int = 64) -> None:
        super().__init__()
        self.linear = nn.Linear(c_z, n_bins)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """z: [B, N, N, c_z] -> logits [B, N, N, n_bins]."""
        return self.linear(z + z.transpose(1, 2))


class PLDDTHead(nn.Module):
    """Per-token lDDT-Calpha in n_bins bins on [0, 1], from the single track and one sampled structure.

    A slim AF3 confidence head (SI 4.3, Alg 31): the sample's pairwise Calpha distances are embedded in bins
    (3.375-21.375 A) and added to a projection of the pair track; a ReLU, a masked mean over partners j, and a
    projection carry them to the single track, which a transition and a linear layer turn into logits. The
    caller detaches s and z, so no gradient reaches the trunk.

    Parameters
    ----------
    c_s, c_z : single and pair channels of the trunk
    n_bins : lDDT bins (AF3: 50)
    c_pair : channels of the pair features that carry the distances (kept small: they exist per sample)
    n_distance_bins : distance bins of the sampled structure (AF3: 11 between 3.375 and 21.375 A)
    """

    def __init__(self, *, c_s: int, c_z: int, n_bins: int = 50, c_pair: int = 32, n_distance_bins: int = 11) -> None:
        super().__init__()
        self.n_distance_bins = n_distance_bins
        self.layer_norm_s = LayerNorm(c_s)
        self.linear_s = nn.Linear(c_s, c_s, bias=False)
        self.layer_norm_z = LayerNorm(c_z)
        self.linear_z = nn.Linear(c_z, c_pair, bias=False)
        self.embed_distance = nn.Embedding(n_distance_bins, c_pair)
        self.linear_pair_to_single = nn.Linear(c_pair, c_s, bias=False)
        self.transition = Transition(c=c_s, n=2)
        self.layer_norm_out = LayerNorm(c_s)
        self.linear_out = nn.Linear(c_s, n_bins)

    def forward(self, s: torch.Tensor, z: torch.Tensor, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits of the per-token lDDT of each sampled structure.

        Parameters
        ----------
        s : [B, N, c_s] trunk single track (detached by the caller)
        z : [B, N, N, c_z] trunk pair track (detached by the caller)
        x : [B, S, N, 3] sampled Calpha coordinates
        mask : [B, N] bool, True = real token

        Returns
        -------
        logits [B, S, N, n_bins]
        """
        boundaries = bin_boundaries(self.n_distance_bins, 3.375, 21.375, device=x.device)
        d = torch.cdist(x.float(), x.float())                                 # [B, S, N, N]
        d_bin = torch.bucketize(d, boundaries)
        pair = self.linear_z(self.layer_norm_z(z))[:, None] + self.embed_distance(d_bin)   # [B, S, N, N, c_pair]
        pair_mask = (mask[:, :, None] & mask[:, None, :])[:, None, :, :, None].to(pair.dtype)
        pooled = (torch.relu(pair) * pair_mask).sum(-2) / pair_mask.sum(-2).clamp(min=1)   # [B, S, N, c_pair]
        a = self.linear_s(self.layer_norm_s(s))[:, None] + self.linear_pair_to_single(pooled)  # [B, S, N, c_s]
        a = a + self.transition(a)
        return self.linear_out(self.layer_norm_out(a))
