"""Stream programs: each placement compiles to the operations its equations say."""

import pytest

from residual_stream.program import (
    PLACEMENTS,
    Add,
    Embed,
    Mark,
    Norm,
    Read,
    Scale,
    compile_block,
    compile_program,
    describe,
)

ALL = {f"L0.{r}" for r in ("ln_attn_in", "ln_mlp_in", "ln_attn_out", "ln_mlp_out",
                           "ln_resid_attn", "ln_resid_mlp")}


def test_pre_norm_has_no_norm_on_the_stream():
    ops = compile_block("pre", 0, ALL - {"L0.ln_attn_out", "L0.ln_mlp_out"})
    assert ops == [Read("L0.attn", "L0.ln_attn_in"), Add("L0.attn"),
                   Read("L0.mlp", "L0.ln_mlp_in"), Add("L0.mlp")]
    # with its write roles filled (Granite's multipliers), each write is added through them
    ops = compile_block("pre", 0, ALL)
    assert ops[1] == Add("L0.attn", "L0.ln_attn_out") and ops[3] == Add("L0.mlp", "L0.ln_mlp_out")
    assert not any(isinstance(o, Norm) for o in ops)


def test_post_norm_normalizes_after_each_add():
    ops = compile_block("post", 0, ALL)
    assert ops == [Read("L0.attn", None), Add("L0.attn"), Norm("L0.ln_resid_attn"),
                   Read("L0.mlp", None), Add("L0.mlp"), Norm("L0.ln_resid_mlp")]


def test_sandwich_normalizes_writes_and_parallel_reads_the_block_input():
    assert compile_block("sandwich", 0, ALL)[1] == Add("L0.attn", "L0.ln_attn_out")
    par = compile_block("parallel", 0, ALL)
    assert [type(o) for o in par] == [Read, Read, Add, Add]


def test_deepnorm_scales_before_each_add():
    ops = compile_block("deepnorm", 0, ALL, alpha=2.0)
    assert ops == [Read("L0.attn", None), Scale(2.0), Add("L0.attn"), Norm("L0.ln_resid_attn"),
                   Read("L0.mlp", None), Scale(2.0), Add("L0.mlp"), Norm("L0.ln_resid_mlp")]


def test_missing_norms_drop_out():
    # norm="none": reads become raw, Norm ops and write norms disappear
    for placement in PLACEMENTS:
        ops = compile_block(placement, 0, set())
        assert not any(isinstance(o, Norm) for o in ops)
        assert all(o.norm is None for o in ops if isinstance(o, Read))
        assert all(o.via is None for o in ops if isinstance(o, Add))


def test_whole_program_marks_every_point():
    prog = compile_program(placement="post", n_layers=2, embeds=("embed", "pos_embed"),
                           norms={"ln_embed", "L0.ln_resid_attn"})
    assert prog[:4] == (Embed("embed"), Embed("pos_embed"), Norm("ln_embed"), Mark(0))
    assert [o.point for o in prog if isinstance(o, Mark)] == [0, 1, 2, "final"]
    assert "x = ln_embed(x)" in describe(prog)
    # a norm that is a constant multiplier is shown as its value
    assert describe(prog, {"ln_embed": 3.0}).splitlines()[2] == "x = 3·x"
    granite = compile_block("pre", 0, {"L0.ln_attn_in", "L0.ln_attn_out"})
    assert describe(tuple(granite), {"L0.ln_attn_out": 0.22}).splitlines()[1] == "x += 0.22·L0.attn"


def test_unknown_placement():
    with pytest.raises(ValueError, match="unknown placement"):
        compile_block("middle", 0, set())


def test_a_token_embedding_multiplier_scales_only_what_comes_before_the_positions():
    """Marian's √d_model multiplies the token embedding alone, before the positions are added: its norm
    follows ``Embed("embed")`` and precedes the others. Where the token embedding would not come first,
    the multiplier would scale an earlier embedding too: refused."""
    prog = compile_program(placement="post", n_layers=1, embeds=("embed", "pos_embed"),
                           norms={"ln_embed_token", "L0.ln_resid_attn", "L0.ln_resid_mlp"})
    assert prog[:3] == (Embed("embed"), Norm("ln_embed_token"), Embed("pos_embed"))
    with pytest.raises(ValueError, match="token embedding needs it first"):
        compile_program(placement="post", n_layers=1, embeds=("pos_embed", "embed"),
                        norms={"ln_embed_token"})
