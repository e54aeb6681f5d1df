"""Figure builders build from real results: trace types, titles, axes, escaped labels."""

import plotly.graph_objects as go
import pytest
from conftest import TEXTS

import residual_stream as rs
from residual_stream import plotting
from residual_stream.analyses.subspaces import mean_direction, orthogonal_split, write_vector


@pytest.fixture(scope="module")
def trace():
    model = rs.twin(norm="layernorm", placement="pre", n_layers=3, d_model=32, seed=0)
    return rs.trace(model, TEXTS + ["<script>alert(1)</script>"], patterns=True)


def test_labels_escape_tags_and_keep_quotes():
    """Plotly's label markup decodes ``&lt; &gt; &amp;`` but not ``&quot;`` (before, a token
    ``say "hi"`` showed as ``say &quot;hi&quot;``); by hand."""
    from residual_stream.plotting.labels import escape, readable, token_labels

    assert escape('say "hi" <b>it\'s</b> & co') == 'say "hi" &lt;b&gt;it\'s&lt;/b&gt; &amp; co'
    assert token_labels(['"q"', "<s>"]) == ['0 "q"', "1 &lt;s&gt;"]
    assert readable("Ġthe") == readable(" the") == "␣the" and readable("ĊĊ") == readable("\n\n") == "↵↵"


def test_program_figure_shows_the_blocks_it_says_and_names_each_write():
    """A 6-block DeepNorm twin drawn with ``max_blocks=1``: the embedding, block 0's own
    operations (its two α-scalings among them; before, all twelve were drawn) and the end;
    each read and write marker is labelled with its component (before, every write was "x").
    Reference: the program's own operations between ``Mark(0)`` and ``Mark(1)``."""
    from residual_stream.program import Mark, Scale

    model = rs.twin(norm="layernorm", placement="deepnorm", n_layers=6, d_model=16, seed=0)
    program = model.anatomy.program
    first, second = program.index(Mark(0)), program.index(Mark(1))
    block0 = list(program[first + 1:second])
    ends = [op for op in program[:first] + program[program.index(Mark(6)):] if not isinstance(op, Mark)]
    fig = plotting.program_figure(model.anatomy, max_blocks=1)
    marks = {d.name: list(d.text) for d in fig.data[1:]}
    assert sum(len(t) for t in marks.values()) == len(block0) + len(ends)
    assert len(marks["stream scaled (α)"]) == sum(isinstance(op, Scale) for op in block0) == 2
    assert marks["write added (through its norm)"] == ["L0.attn", "L0.mlp"]
    assert marks["component reads (through its norm)"] == ["L0.attn", "L0.mlp"]
    assert "first 1 of 6 blocks" in fig.layout.title.text


def test_growth_figures(trace):
    g = rs.norm_growth(trace)
    fig = plotting.norm_growth_figure(g)
    assert isinstance(fig, go.Figure) and len(fig.data) == 4
    assert fig.layout.yaxis.title.text == "‖x‖ (L2 norm)"
    assert list(fig.data[1].y) == pytest.approx(g.mean.tolist())
    rel = plotting.update_size_figure(g, relative_depth=True)
    assert rel.layout.xaxis.title.text == "relative depth" and max(rel.data[0].x) < 1


def test_heatmaps_and_graph(trace):
    s = plotting.survival_figure(rs.survival(trace), "share")
    assert s.data[0].type == "heatmap" and s.data[0].zmid == 0
    ra = rs.read_attribution(trace).matrix("component", absolute=True)
    graph = plotting.read_write_graph(ra, threshold=0.1, highlight="L1.attn")
    edges = [d for d in graph.data if d.mode == "lines"]
    assert edges and all(d.line.width >= 1 for d in edges)
    assert any(d.line.color == "crimson" for d in edges)
    hm = plotting.heatmap(ra, title="t", x_title="source", y_title="reader", colorbar="share")
    assert hm.layout.xaxis.title.text == "source" and hm.data[0].z.shape == ra.shape


def test_graph_nodes_never_share_a_point():
    """A post-LN twin with biases: each norm's bias is a source of its own (before, it sat on
    its block's attention node, and ``pos_embed`` on ``embed``), so every node has its own
    point and an edge's ends say which node it joins. Reference: the matrix's own labels."""
    m = rs.twin(norm="layernorm", placement="post", n_layers=2, d_model=32, seed=0, bias=True)
    ra = rs.read_attribution(rs.trace(m, TEXTS)).matrix("component", absolute=True)
    nodes = plotting.read_write_graph(ra, threshold=0.0).data[-1]
    assert {"L0.ln_resid_attn.bias", "pos_embed", "L0.attn"} <= set(nodes.customdata)
    points = list(zip(nodes.x, nodes.y, strict=True))
    assert len(set(points)) == len(points) == len(nodes.customdata)


def test_lens_and_bars_escape_user_text(trace):
    lens = plotting.lens_figure(rs.logit_lens(trace), 2, trace.str_tokens[2])
    labels = list(lens.data[0].x)
    assert not any("<script>" in x for x in labels) and any("&lt;" in x for x in labels)
    assert len(set(labels)) == len(labels)  # repeated tokens stay distinct categories
    names, f = orthogonal_split(write_vector(trace, "L1.attn")[0, :3], [mean_direction(32)])
    bars = plotting.subspace_bars(names, f, ["a", "b", "c"], title="split")
    assert bars.layout.barmode == "stack" and len(bars.data) == 2
    dla = rs.direct_logit_attribution(trace).to_frame()
    top = plotting.contribution_bars(dla, "logit", title="DLA", top=5)
    assert len(top.data[0].y) == 5


def test_lens_depth_figure_draws_a_scan_summary_with_its_band():
    """Reference: the scan's own per-point summary (KL, clustered s.e., top-1 agreement)."""
    model = rs.twin(norm="rmsnorm", placement="pre", n_layers=2, d_model=32, seed=0)
    summary = rs.scan(model, TEXTS * 3, "lens", batch_size=2, seq_len=32, progress=False).stats["lens"]
    fig = plotting.lens_depth_figure(summary, name="<b>twin</b>")
    band, kl, top1 = fig.data
    assert (summary.kl >= 0).all() and summary.kl.iloc[-1] <= plotting.growth.KL_ROUNDING
    drawn = summary[summary.kl > plotting.growth.KL_ROUNDING]  # the final point is left off
    n = len(drawn)
    assert n == len(summary) - 1 and list(kl.x) == list(drawn.point)
    assert list(kl.y) == pytest.approx(drawn["kl"].tolist())
    assert list(band.y[:n]) == pytest.approx((drawn["kl"] + 2 * drawn["kl_se_texts"]).tolist())
    low = (drawn["kl"] - 2 * drawn["kl_se_texts"]).clip(lower=drawn["kl"] / 10)
    assert list(band.y[n:]) == pytest.approx(low.tolist()[::-1])
    assert list(top1.y) == pytest.approx(summary["top1_agreement"].tolist()) and top1.yaxis == "y2"
    assert "<b>" not in kl.name and fig.layout.yaxis2.range == (0, 1)
