"""Each sub-layer against a plain einsum version of its AF3 SI algorithm, written here, in float64."""
import math

import pytest
import torch

from mini_of3.model.attention import AttentionPairBias
from mini_of3.model.embedder import InputEmbedder, RelativePositionEncoding
from mini_of3.model.heads import DistogramHead
from mini_of3.model.kernel_choice import KernelChoice
from mini_of3.model.pairformer import PairformerBlock, shared_dropout
from mini_of3.model.transition import AdaLN, ConditionedTransitionBlock, Transition
from mini_of3.model.triangle import TriangleAttention, TriangleMultiplication

B, N = 2, 7
TORCH = KernelChoice(tri_attn_backend="torch", tri_mul_backend="torch", pair_transition_backend="torch")


def randomise(module, seed=0):
    """Random values in every parameter (LayerNorm weights and biases too) so that no term can hide."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return module.double()


def layer_norm(x, w=None, b=None, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def lin(x, layer):
    return torch.einsum("...i,oi->...o", x, layer.weight) + (layer.bias if layer.bias is not None else 0)


def token_mask():
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, -2:] = False
    return mask


@pytest.mark.parametrize("direction", ["outgoing", "incoming"])
def test_triangle_multiplication_alg12_13(direction):
    m = randomise(TriangleMultiplication(c_z=6, c_hidden=5, direction=direction, kernels=TORCH))
    z = torch.randn(B, N, N, 6, dtype=torch.float64)
    mask = token_mask()
    pair = (mask[:, :, None] & mask[:, None, :]).double()[..., None]
    x = layer_norm(z, m.norm_in.weight, m.norm_in.bias)
    ab = torch.sigmoid(lin(x, m.g_in)) * lin(x, m.p_in) * pair
    a, b = ab[..., :5], ab[..., 5:]
    if direction == "outgoing":
        t = torch.einsum("bikc,bjkc->bijc", a, b)          # Alg 12: sum_k a_ik b_jk
    else:
        t = torch.einsum("bkic,bkjc->bijc", a, b)          # Alg 13: sum_k a_ki b_kj
    expected = torch.sigmoid(lin(x, m.g_out)) * lin(layer_norm(t, m.norm_out.weight, m.norm_out.bias), m.p_out)
    torch.testing.assert_close(m(z, mask[:, :, None] & mask[:, None, :]), expected)


@pytest.mark.parametrize("node", ["starting", "ending"])
@pytest.mark.parametrize("activation", ["softmax", "sigmoid"])
def test_triangle_attention_alg14_15(node, activation):
    H, D = 2, 3
    m = randomise(TriangleAttention(c_z=6, n_heads=H, c_hidden=D, node=node,
                                       kernels=KernelChoice(tri_attn_backend="torch", tri_attn_activation=activation)))
    z = torch.randn(B, N, N, 6, dtype=torch.float64)
    mask = token_mask()
    pair = mask[:, :, None] & mask[:, None, :]
    x = layer_norm(z, m.layer_norm.weight, m.layer_norm.bias)
    q, k, v = (lin(x, layer).view(B, N, N, H, D) for layer in (m.linear_q, m.linear_k, m.linear_v))
    bias = lin(x, m.linear_b)                                      # [B, N, N, H]
    if node == "starting":   # Alg 14: softmax_k(q_ij . k_ik + b_jk), keys (i, k)
        logits = torch.einsum("bijhd,bikhd->bhijk", q, k) / math.sqrt(D) + bias.permute(0, 3, 1, 2)[:, :, None]
        key_ok = pair[:, None, :, None, :]                         # pair (i, k) valid
    else:                    # Alg 15: softmax_k(q_ij . k_kj + b_ki), keys (k, j)
        logits = torch.einsum("bijhd,bkjhd->bhijk", q, k) / math.sqrt(D) + bias.permute(0, 3, 2, 1)[:, :, :, None]
        key_ok = pair.transpose(1, 2)[:, None, None, :, :]         # [b, 1, 1, j, k]: pair (k, j) valid
    key_ok = key_ok.expand_as(logits)
    if activation == "softmax":
        p = torch.softmax(logits.masked_fill(~key_ok, -1e300), dim=-1) * key_ok
    else:
        beta = -torch.log(key_ok.sum(-1, keepdim=True).clamp(min=1).double())
        p = torch.sigmoid(logits + beta) * key_ok
    if node == "starting":
        o = torch.einsum("bhijk,bikhd->bijhd", p, v)
    else:
        o = torch.einsum("bhijk,bkjhd->bijhd", p, v)
    expected = lin(torch.sigmoid(lin(x, m.linear_g)) * o.reshape(B, N, N, H * D), m.linear_o)
    out = m(z, pair)
    real = pair[..., None].expand_as(out)                       # padded rows attend to nothing: not compared
    torch.testing.assert_close(out[real], expected[real])


def test_transition_alg11():
    m = randomise(Transition(c=4, n=3))
    x = torch.randn(B, N, 4, dtype=torch.float64)
    y = layer_norm(x, m.layer_norm.weight, m.layer_norm.bias)
    a, b = lin(y, m.linear_a), lin(y, m.linear_b)
    torch.testing.assert_close(m(x), lin(a * torch.sigmoid(a) * b, m.linear_out))


def test_adaln_alg26_and_conditioned_transition_alg25():
    ada = randomise(AdaLN(c_a=4, c_s=5))
    a, s = torch.randn(B, N, 4, dtype=torch.float64), torch.randn(B, N, 5, dtype=torch.float64)
    s_norm = layer_norm(s, ada.layer_norm_s.weight)
    expected = torch.sigmoid(lin(s_norm, ada.linear_scale)) * layer_norm(a) + lin(s_norm, ada.linear_shift)
    torch.testing.assert_close(ada(a, s), expected)
    block = randomise(ConditionedTransitionBlock(c_a=4, c_s=5, n=2), seed=1)
    a2 = block.ada_ln(a, s)
    b = torch.nn.functional.silu(lin(a2, block.linear_a)) * lin(a2, block.linear_b)
    torch.testing.assert_close(block(a, s), torch.sigmoid(lin(s, block.linear_gate)) * lin(b, block.linear_out))
    assert torch.equal(ConditionedTransitionBlock(c_a=4, c_s=5).linear_gate.bias.detach(), torch.full((4,), -2.0))


@pytest.mark.parametrize("conditioned", [False, True])
def test_attention_pair_bias_alg24(conditioned):
    H, c_a, c_z, c_s, I = 2, 8, 6, 5, 3
    m = randomise(AttentionPairBias(c_a=c_a, c_z=c_z, n_heads=H, c_s=c_s if conditioned else None, kernels=TORCH))
    a = torch.randn(B, I, N, c_a, dtype=torch.float64)
    z = torch.randn(B, N, N, c_z, dtype=torch.float64)
    s = torch.randn(B, I, N, c_s, dtype=torch.float64) if conditioned else None
    mask = token_mask()
    x = m.norm_a(a, s) if conditioned else layer_norm(a, m.norm_a.weight, m.norm_a.bias)
    D = c_a // H
    q, k, v = (lin(x, layer).view(B, I, N, H, D) for layer in (m.linear_q, m.linear_k, m.linear_v))
    bias = lin(layer_norm(z, m.layer_norm_z.weight, m.layer_norm_z.bias), m.linear_b)    # [B, N(i), N(j), H]
    logits = torch.einsum("bsihd,bsjhd->bshij", q, k) / math.sqrt(D) + bias.permute(0, 3, 1, 2)[:, None]
    logits = logits.masked_fill(~mask[:, None, None, None, :], -1e300)
    o = torch.einsum("bshij,bsjhd->bsihd", torch.softmax(logits, -1), v).reshape(B, I, N, c_a)
    expected = lin(torch.sigmoid(lin(x, m.linear_g)) * o, m.linear_o)
    if conditioned:
        expected = torch.sigmoid(lin(s, m.linear_s_gate)) * expected
    torch.testing.assert_close(m(a, z, mask, s), expected)


def relpos_loops(residue_index, asym_id, entity_id, sym_id, r_max=32, s_max=2):
    """AF3 SI Alg 3 written pair by pair, with the sym_id offset keyed on the entity as AF3's released code."""
    n = len(residue_index)
    out = torch.zeros(n, n, 2 * (2 * r_max + 2) + 1 + 2 * s_max + 2)
    for i in range(n):
        for j in range(n):
            same_chain = asym_id[i] == asym_id[j]
            same_res = residue_index[i] == residue_index[j]
            off = int(residue_index[i] - residue_index[j])
            d_res = min(max(off + r_max, 0), 2 * r_max) if same_chain else 2 * r_max + 1
            d_tok = min(max(off + r_max, 0), 2 * r_max) if same_chain and same_res else 2 * r_max + 1
            same_entity = entity_id[i] == entity_id[j]
            d_chain = min(max(int(sym_id[i] - sym_id[j]) + s_max, 0), 2 * s_max) if same_entity else 2 * s_max + 1
            out[i, j, d_res] = 1
            out[i, j, 2 * r_max + 2 + d_tok] = 1
            out[i, j, 4 * r_max + 4] = float(entity_id[i] == entity_id[j])
            out[i, j, 4 * r_max + 5 + d_chain] = 1
    return out


def test_relative_position_encoding_alg3():
    residue_index = torch.tensor([1, 2, 3, 50, 1, 2, 90, 1, 5, 6])    # long gaps clip at r_max
    asym_id = torch.tensor([1, 1, 1, 1, 2, 2, 2, 3, 4, 4])
    entity_id = torch.tensor([1, 1, 1, 1, 1, 1, 1, 2, 1, 1])
    sym_id = torch.tensor([1, 1, 1, 1, 2, 2, 2, 1, 5, 5])              # sym offsets clip at s_max
    m = RelativePositionEncoding(c_z=8)
    feats = m.features(*(t[None] for t in (residue_index, asym_id, entity_id, sym_id)))[0]
    torch.testing.assert_close(feats, relpos_loops(residue_index, asym_id, entity_id, sym_id))
    assert feats.shape[-1] == m.n_features == 139


def chain_bins(asym_id, entity_id, sym_id):
    """The index of the hot sym_id-offset bin (the last 2 s_max + 2 = 6 features) of each token pair."""
    m = RelativePositionEncoding(c_z=8)
    residue_index = torch.tensor([1, 2, 1, 2])
    feats = m.features(*(torch.as_tensor(t)[None] for t in (residue_index, asym_id, entity_id, sym_id)))[0]
    return feats[..., -6:].argmax(-1)


def test_relative_chain_feature_bins_sym_offset_within_an_entity():
    """Two chains of two tokens, s_max = 2 (bins 0..4 for offsets -2..2, bin 5 for 'another entity'), worked by
    hand from AF3's create_relative_encoding. The SI's typo (keyed on the chain) would give bin 5 within each chain
    and the offset bin between the heterodimer's chains."""
    # homodimer: one entity, sym_id 0 and 1 -> offset 0 within a chain (bin 2), -1 / +1 between chains (bins 1 / 3)
    homo = chain_bins([0, 0, 1, 1], [0, 0, 0, 0], [0, 0, 1, 1])
    assert homo.tolist() == [[2, 2, 1, 1], [2, 2, 1, 1], [3, 3, 2, 2], [3, 3, 2, 2]]
    # heterodimer: two entities, each chain sym_id 0 -> bin 2 within a chain, the spare bin 5 between them
    hetero = chain_bins([0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 0, 0])
    assert hetero.tolist() == [[2, 2, 5, 5], [2, 2, 5, 5], [5, 5, 2, 2], [5, 5, 2, 2]]


def test_input_embedder_alg1_lines_1_to_4():
    m = randomise(InputEmbedder(c_s=5, c_z=4)).float()
    batch = {"restype": torch.tensor([[0, 20, 7, 3]]), "residue_index": torch.tensor([[1, 2, 3, 4]]),
             "asym_id": torch.ones(1, 4, dtype=torch.long), "entity_id": torch.ones(1, 4, dtype=torch.long),
             "sym_id": torch.ones(1, 4, dtype=torch.long)}
    s_inputs, s_init, z_init = m(batch)
    onehot = torch.nn.functional.one_hot(batch["restype"], 21).float()
    torch.testing.assert_close(s_init, onehot @ m.linear_s.weight.T)
    rel = m.relpos(batch["residue_index"], batch["asym_id"], batch["entity_id"], batch["sym_id"])
    expected = (onehot @ m.linear_z_i.weight.T)[:, :, None] + (onehot @ m.linear_z_j.weight.T)[:, None] + rel
    torch.testing.assert_close(z_init, expected)
    with pytest.raises(ValueError, match="restype"):
        m({**batch, "restype": torch.tensor([[0, 21, 1, 1]])})


def test_distogram_head_is_symmetric():
    m = randomise(DistogramHead(c_z=6, n_bins=64))
    z = torch.randn(B, N, N, 6, dtype=torch.float64)
    logits = m(z)
    torch.testing.assert_close(logits, logits.transpose(1, 2))
    torch.testing.assert_close(logits, lin(z + z.transpose(1, 2), m.linear))


def test_shared_dropout_rowwise_and_columnwise():
    x = torch.ones(1, 30, 30, 8)
    torch.manual_seed(0)
    rows = shared_dropout(x, 0.25, 1, training=True)
    assert torch.equal(rows, rows[:, :1].expand_as(rows))         # one mask for every row i
    cols = shared_dropout(x, 0.25, 2, training=True)
    assert torch.equal(cols, cols[:, :, :1].expand_as(cols))      # one mask for every column j
    assert torch.allclose(rows.unique(), torch.tensor([0.0, 1 / 0.75]))
    assert torch.equal(shared_dropout(x, 0.25, 1, training=False), x)


def test_pairformer_block_follows_alg17_order():
    block = randomise(PairformerBlock(c_s=8, c_z=6, n_heads_tri=2, c_hidden_tri=3, n_heads_single=2,
                                      c_hidden_mul=5, transition_factor=2, kernels=TORCH)).eval()
    s = torch.randn(B, N, 8, dtype=torch.float64)
    z = torch.randn(B, N, N, 6, dtype=torch.float64)
    mask = token_mask()
    pair = mask[:, :, None] & mask[:, None, :]
    z2 = z + block.tri_mul_out(z, pair)
    z2 = z2 + block.tri_mul_in(z2, pair)
    z2 = z2 + block.tri_attn_start(z2, pair)
    z2 = z2 + block.tri_attn_end(z2, pair)
    z2 = z2 + block.pair_transition(z2)
    s2 = s + block.single_attention(s[:, None], z2, mask)[:, 0]
    s2 = s2 + block.single_transition(s2)
    s_out, z_out = block(s, z, mask)
    torch.testing.assert_close(z_out, z2)
    torch.testing.assert_close(s_out, s2)
