"""Reports and the CLI around them: content, escaping, determinism, bad input, exit codes."""

import json
from html.parser import HTMLParser

import numpy as np
import pytest
from tiny_hf import build

import residual_stream as rs
from residual_stream.cli import main
from residual_stream.report import build_report, select_texts
from residual_stream.streaming.corpus import builtin_corpus

EVIL = "<script>window.__pwned=1</script></div> & friends"


class Checker(HTMLParser):
    """Fails on mismatched tags; counts plot divs and scripts."""

    VOID = {"meta", "br", "hr", "img", "input", "link"}

    def __init__(self):
        super().__init__()
        self.stack, self.plots, self.errors = [], 0, []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)
        if tag == "div" and dict(attrs).get("id", "").startswith("fig-"):
            self.plots += 1

    def handle_endtag(self, tag):
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(tag)


def twins():
    return [rs.twin(norm="rmsnorm", placement="pre", n_layers=2, seed=0),
            rs.twin(norm="layernorm", placement="post", n_layers=2, seed=0)]


@pytest.fixture(scope="module")
def report():
    return build_report(twins(), builtin_corpus()[:6] + [EVIL], max_tokens=400,
                        title=f"title {EVIL}")


def test_report_is_well_formed_and_complete(report):
    page, data = report
    checker = Checker()
    checker.feed(page)
    assert not checker.errors and checker.stack == []
    assert checker.plots >= 2 * 3 + 8 + 2  # programs, reads, composition, comparisons, norm-lab
    assert "id=\"fig-comp-0\"" in page and "id=\"fig-comp-1\"" in page
    for section in ("anatomy", "growth", "retention", "unembed", "mixing", "reads", "normlab",
                    "conservation", "methods", "metadata"):
        assert f"id='{section}'" in page
    # plotly inlined, no external script: the file opens offline
    assert "<script src=" not in page and "src=\"http" not in page and "Plotly" in page
    assert data["metadata"]["seed"] == 0 and data["metadata"]["tokens"]


def test_the_composition_figure_is_the_apis_by_layer_pair():
    """Each model's K-composition heatmap in the report: ``Composition.matrix("k")`` of the
    API, its largest cell the report's ``max_k_composition``, titled with the model."""
    from residual_stream.report import analyse

    model = twins()[1]
    section = analyse(model, builtin_corpus()[:2], label="post twin")
    fig = section.figures["composition"]
    expected = rs.composition(model).matrix("k")
    assert np.allclose(np.array(fig.data[0].z, dtype=float), expected.to_numpy(), equal_nan=True)
    assert np.nanmax(expected.to_numpy()) == pytest.approx(section.numbers["max_k_composition"], rel=1e-6)
    assert fig.layout.title.text.endswith(": post twin") and "K composition" in fig.layout.title.text


def test_a_one_layer_model_reports_no_composition_rather_than_0():
    """A one-layer model has no head reading another's write: its report says so, with the
    number None in the data, where it said "Max K-composition 0.000"."""
    from residual_stream.report import analyse
    from residual_stream.report_html import render

    section = analyse(rs.twin(norm="layernorm", placement="post", n_layers=1), builtin_corpus()[:2],
                      label="one layer")
    assert section.numbers["max_k_composition"] is None
    page = render("t", [section], {}, {}, {}, ["x"])
    assert "No head reads another head&#x27;s write (one layer)." in page
    assert "Max K-composition 0" not in page


def test_user_text_is_escaped(report):
    page, _ = report
    assert "<script>window.__pwned" not in page and "&lt;script&gt;window.__pwned" in page


def test_report_numbers_are_the_apis(report):
    _, data = report
    model = twins()[1]
    texts = select_texts(model, builtin_corpus()[:6] + [EVIL], 400)  # what the report used
    api = rs.norm_growth(rs.trace(model, texts, patterns=True, overflow="chunk"))
    assert data["models"][model.name]["norm_mean"] == pytest.approx(api.mean.tolist(), rel=1e-6)


def test_the_token_budget_holds_for_a_first_text_longer_than_it():
    """``--max-tokens 64`` on one line of 3,000 words: the text is cut to its longest prefix
    of at most 64 tokens (before, the whole line, 15,000 tokens, was traced in chunks).
    Reference: the tokenizer's own count of the prefix and of one more character."""
    model, long = twins()[0], "words " * 3000
    for budget in (64, 1):
        (cut,) = select_texts(model, [long, "a second text"], budget)
        count = lambda t: len(model.tokenizer(t, add_special_tokens=True)["input_ids"])  # noqa: E731
        assert long.startswith(cut) and len(cut) >= 1
        assert count(cut) <= max(budget, count(long[:1])) < count(long[:len(cut) + 1])
    assert select_texts(model, ["short", long], 64) == ["short"]  # a later text is never cut
    _, data = build_report(twins()[:1], [long], max_tokens=64)
    assert data["metadata"]["tokens"] == {model.name: 64}


def test_a_report_reads_a_corpus_only_as_far_as_the_budgets_reach():
    """An endless iterator of texts: each model takes the leading texts its budget fits, as
    ``select_texts`` takes them from a list (reference), and nothing past the longest of those
    prefixes (and the one text that did not fit) is read. Before, the CLI read every text of the
    corpus into a list first, however few the budget used."""
    import itertools

    from residual_stream.report import Leading

    texts = (f"Text number {i} of an endless corpus." for i in itertools.count())
    leading = Leading(texts)
    models = twins()
    _, data = build_report(models, leading, max_tokens=60)
    listed = [f"Text number {i} of an endless corpus." for i in range(200)]
    chosen = [select_texts(m, listed, 60) for m in models]
    assert data["metadata"]["texts"] == max(map(len, chosen))
    assert leading.read == max(map(len, chosen)) + 1  # the first text that did not fit, no more
    assert list(itertools.islice(leading, 3)) == listed[:3]  # a second reading replays the first


def test_cli_report_reads_the_text_field_of_json_lines(tmp_path):
    """``--text-field`` as ``scan`` has it: a folder of JSON Lines records whose text is in
    ``content`` is reported on those texts (reference: the API's report on the same texts)."""
    import gzip

    folder = tmp_path / "corpus"
    folder.mkdir()
    records = [{"content": f"Record {i}: the stream grows.", "id": i} for i in range(40)]
    (folder / "part.jsonl.gz").write_bytes(gzip.compress("\n".join(map(json.dumps, records)).encode()))
    data = tmp_path / "r.json"
    argv = ["report", "--model", "twin-pre-ln", "--corpus", str(folder), "--max-tokens", "100",
            "--out", str(tmp_path / "r.html"), "--data", str(data), "--quiet"]
    assert main(argv + ["--text-field", "content"]) == 0
    got = json.loads(data.read_text())
    _, want = build_report([rs.load("twin-pre-ln")], [r["content"] for r in records], max_tokens=100)
    assert got["metadata"]["texts"] == want["metadata"]["texts"] > 1
    norms = [d["models"]["twin-pre-ln"]["norm_mean"] for d in (got, want)]
    assert norms[0] == pytest.approx(norms[1], rel=1e-6)
    data.unlink()
    assert main(argv) == 1 and not data.exists()  # records without a "text" field: said, nothing written


def test_models_of_one_name_keep_one_section_each():
    """Two models called alike (two folders named ``ckpt``) get distinct labels, their source
    added, so the JSON keeps both (before, the second replaced the first); the same source
    twice gets a number. Reference: each model's own report alone."""
    from dataclasses import replace

    from residual_stream.report import labels

    a, b = (replace(m, name="ckpt", source=f"/runs/{i}/ckpt") for i, m in enumerate(twins()))
    assert labels([a, b]) == ["ckpt (/runs/0/ckpt)", "ckpt (/runs/1/ckpt)"]
    assert labels([a, a, b]) == ["ckpt (/runs/0/ckpt) #1", "ckpt (/runs/0/ckpt) #2",
                                 "ckpt (/runs/1/ckpt)"]
    page, data = build_report([a, b], ["one text", "another text"])
    for label, model in zip(labels([a, b]), (a, b), strict=True):
        alone = build_report([model], ["one text", "another text"])[1]["models"]["ckpt"]
        assert data["models"][label]["norm_mean"] == alone["norm_mean"]
        assert page.count(f"<h3>{label}</h3>") == 2, label  # its anatomy and conservation sections


def test_same_seed_same_report():
    a = build_report(twins()[:1], ["one text", "another text"], seed=3)
    b = build_report(twins()[:1], ["one text", "another text"], seed=3)
    strip = lambda d: {**d, "metadata": {**d["metadata"], "seconds": 0}}  # noqa: E731
    assert strip(a[1]) == strip(b[1])
    assert a[0].split("<h2 id='metadata'>")[0] == b[0].split("<h2 id='metadata'>")[0]


def test_cli_report_on_real_and_folder_models(tmp_path):
    folder = tmp_path / "gpt2"
    build("gpt2").save_pretrained(folder)
    from transformers import AutoTokenizer

    from residual_stream.registry import REGISTRY
    AutoTokenizer.from_pretrained(REGISTRY["minilm-l6"].location()).save_pretrained(folder)
    text = tmp_path / "texts.txt"
    text.write_text("hello world\n\nsecond line here\n")
    out, data = tmp_path / "r.html", tmp_path / "r.json"
    assert main(["report", "--model", "minilm-l6", "--text", str(text), "--out", str(out),
                 "--data", str(data), "--quiet"]) == 0
    numbers = json.loads(data.read_text())["models"]["minilm-l6"]
    assert numbers["placement"] == "post" and numbers["conservation_ok"]
    assert out.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("argv,message", [
    (["report", "--model", "minilm-l6", "--text", "/nonexistent.txt"], "no such file"),
    (["report", "--model", "minilm-l6", "--text", "The cat sat."],  # a text, not a file
     "no such file (report reads its texts from a file, one per line; `check` and `trace`"),
    (["report", "--model", "minilm-l6", "--text", "The cat sat on the mat. " * 12],  # > 255 bytes
     "…: no such file (report reads its texts from a file"),
    (["report", "--model", "no-such-model", "--builtin"], "unknown model"),
    (["report", "--model", "minilm-l6", "--corpus", "EMPTY"], "corpus is empty"),
    (["report", "--model", "minilm-l6", "--builtin", "--out", "/nonexistent/dir/r.html"],
     "not a writable folder"),
    (["report", "--model", "minilm-l6", "--builtin", "--out", "EMPTY"], "it is a folder"),
    (["report", "--model", "minilm-l6", "--builtin", "--out", "SAME", "--data", "SAME"],
     "--data SAME is the file --out names, which is written by this command"),
    (["report", "--model", "twin-pre-ln", "--text", "FILE", "--out", "FILE"],
     "--out FILE is the file --text names, which is read by this command: writing there would "
     "overwrite it"),
    (["report", "--model", "twin-pre-ln", "--text", "FILE", "--data", "FILE"],
     "--data FILE is the file --text names"),
    (["scan", "twin-pre-rms", "FILE", "--out", "FILE"], "--out FILE is the file corpus names"),
    (["scan", "twin-pre-rms", "FILE", "--state", "FILE"], "--state FILE is the file corpus names"),
    (["report", "--model", "minilm-l6", "--builtin", "--max-tokens", "0"],
     "--max-tokens must be positive, got 0"),
    (["report", "--model", "twin-pre-ln", "--model", "twin-pre-ln", "--builtin"],
     "--model twin-pre-ln is given twice"),
    (["report", "--model", "twin-pre-ln", "--corpus", "FILE"], "it is a file, give it as --text"),
    (["report", "--model", "twin-pre-ln", "--text", "EMPTY"], "it is a folder, give it as --corpus"),
    (["scan", "twin-pre-rms", "builtin", "--out", "EMPTY"], "it is a folder"),
    (["scan", "twin-pre-rms", "builtin", "--state", "/nonexistent/dir/s.pt"], "not a writable folder"),
    (["scan", "twin-pre-rms", "builtin", "--seq-len", "0"], "seq_len must be positive"),
    (["scan", "twin-pre-rms", "builtin", "--out", "SAME", "--state", "SAME"],
     "--out SAME is the file --state names"),
    (["scan", "twin-pre-rms", ""], "the corpus is an empty name: give 'builtin', a file"),
    (["check", "twin-pre-rms", "--text", "a text", "--device", "bogus"], "not a device name"),
    (["train", "--norm", "rmsnorm", "--placement", "pre", "--out", "FILE"], "is a file: give a folder"),
    (["heads", "twin-pre-ln", "--length", "1000"], "context of 128: use length ≤ 63"),
    (["heads", "twin-pre-ln", "--top", "0"], "--top must be at least 1, got 0"),
    (["check", "twin-pre-rms", "--text", "a long text " * 20],
     "shorten it, or pass --overflow chunk to split"),
    (["summarize", "twin-pre-rms", "--text", "a long text " * 20], "pass --overflow chunk"),
    (["report"], "give --model (repeat) to analyse models on texts, or --scan"),
    (["report", "--scan", "FILE"], "FILE is not a saved scan, or a damaged one"),
    (["report", "--scan", "FILE", "--out", "FILE"], "--out FILE is the file --scan 1 names"),
    (["report", "--scan", "FILE", "--text", "FILE"], "with --scan alone the scans' own corpora are shown"),
])
def test_cli_errors_exit_1_and_leave_nothing(argv, message, tmp_path, capsys):
    (tmp_path / "EMPTY").mkdir()
    (tmp_path / "FILE").write_text("not a folder")
    argv = [a.replace("EMPTY", str(tmp_path / "EMPTY")).replace("SAME", str(tmp_path / "r.html"))
            .replace("FILE", str(tmp_path / "FILE")) for a in argv]
    if "--out" not in argv and argv[0] not in ("check", "heads", "summarize"):
        argv += ["--out", str(tmp_path / ("r.html" if argv[0] == "report" else "r.json"))]
    message = message.replace("SAME", str(tmp_path / "r.html")).replace("FILE", str(tmp_path / "FILE"))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not list(tmp_path.glob("*.*")) and not list(tmp_path.glob(".*partial"))
    assert (tmp_path / "FILE").read_text() == "not a folder"


def test_cli_overflow_chunk_traces_a_text_longer_than_the_context(capsys):
    """``--overflow chunk`` (which the error advises) splits the text into rows as the API's
    ``overflow="chunk"`` does. Reference: ``rs.trace`` on the same text."""
    text = "a long text " * 20  # 240 bytes: two rows of the twin's 128-token context
    assert main(["check", "twin-pre-rms", "--text", text, "--overflow", "chunk"]) == 0
    want = rs.trace(rs.load("twin-pre-rms"), [text], overflow="chunk").check()
    assert str(want) in capsys.readouterr().out and want.ok


def test_cli_app_refuses_an_allowed_folder_that_does_not_exist(monkeypatch, capsys, tmp_path):
    import os
    import subprocess

    def started(*args, **kwargs):
        raise AssertionError("the app was started")

    monkeypatch.setattr(os, "execve", started)
    monkeypatch.setattr(subprocess, "call", started)
    assert main(["app", "--allow", "/nonexistent/models"]) == 1
    assert "--allow /nonexistent/models: no such folder" in capsys.readouterr().err
    (tmp_path / "a.txt").write_text("x")
    assert main(["app", "--allow", str(tmp_path / "a.txt")]) == 1
    assert f"--allow {tmp_path / 'a.txt'}: a file, not a folder" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--port", "99999"], "--port 99999 is not a port: give one from 1 to 65535"),
    (["--port", "0"], "--port 0 is not a port"),
    (["--host", "999.1.1.1"], "--host 999.1.1.1 does not resolve to an address"),
])
def test_cli_app_refuses_a_port_or_host_no_server_can_listen_on(args, message, monkeypatch, capsys):
    """Each was a traceback out of the server (``OverflowError: bind(): port must be
    0-65535``, ``socket.gaierror``) after the command had handed over to it."""
    import os
    import subprocess

    def started(*a, **kw):
        raise AssertionError("the app was started")

    monkeypatch.setattr(os, "execve", started)
    monkeypatch.setattr(subprocess, "call", started)
    assert main(["app", *args]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_app_without_the_app_folder_says_where_it_is(tmp_path, monkeypatch, capsys):
    """A package built without the app: one line saying so, not Streamlit's traceback."""
    missing = (tmp_path / "_app" / "main.py", tmp_path / "app" / "main.py")
    monkeypatch.setattr("residual_stream.cli.APPS", missing)
    assert main(["app"]) == 1
    err = capsys.readouterr().err
    assert str(tmp_path / "_app" / "main.py") in err and "make app" in err and err.count("\n") == 1


def test_cli_heads_lists_the_top_heads_of_each_score(capsys):
    """``heads`` prints each score's top heads as ``head_scores`` ranks them (reference: the
    API on the same model), the losses, and with ``--json`` every head (losses null without a
    next-token LM head: JSON has no NaN)."""
    import json

    assert main(["heads", "twin-pre-ln", "--top", "2"]) == 0
    out = capsys.readouterr().out
    scores = rs.head_scores(rs.load("twin-pre-ln"))
    for kind in ("previous_token", "duplicate_token", "induction"):
        block = out.split(f"{kind.replace('_', '-')} score, top 2:")[1].split("\n\n")[0]
        assert [line.split()[0] for line in block.strip().splitlines()[1:]] == list(
            scores.top(kind, 2)["head"])
    assert f"first copy {scores.loss_first:.3g} nats, on the repeat {scores.loss_repeat:.3g}" in out
    assert main(["heads", "minilm-l6", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["loss_first"] is None and len(data["heads"]) == 6 * 12
    assert (data["model"], data["length"], data["rows"], data["seed"]) == ("minilm-l6", 50, 4, 0)
    assert max(data["heads"], key=lambda h: h["previous_token"])["head"] == "L0H2"


def test_cli_composition_lists_the_strongest_pairs_and_a_readers_writers(capsys):
    """``composition`` prints the ``--top`` pairs of a kind in ``to_frame``'s order by score, or
    one reader's writers as ``Composition.top`` gives them, with the random baseline; on a
    post-norm model ``--weights-only`` gives the unfolded scores; bad options exit 1 or 2."""
    import json

    model = rs.load("minilm-l6")
    folded, weights = rs.composition(model), rs.composition(model, through_norms=False)
    assert main(["composition", "minilm-l6", "--top", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    frame = folded.to_frame().query("kind == 'k'").sort_values("score", ascending=False)
    assert [(r["writer"], r["reader"]) for r in data["rows"]] == list(zip(frame.writer[:3], frame.reader[:3],
                                                                          strict=True))
    assert data["rows"][0]["score"] == pytest.approx(float(frame.score.iloc[0]), rel=1e-6)
    assert data["through_norms"] and data["baseline"] == pytest.approx(folded.baseline["k"])
    assert main(["composition", "minilm-l6", "--reader", "L5H3", "--kind", "v", "--weights-only"]) == 0
    out = capsys.readouterr().out
    assert "V composition into L5H3, weights alone (random baseline" in out
    top = weights.top("L5H3", "v", 10)
    listed = [line.split() for line in out.strip().splitlines()[3:]]
    assert [w for w, _, _ in listed] == list(top.writer)
    assert [float(s) for _, _, s in listed] == pytest.approx(list(top.score), abs=1e-6)
    assert main(["composition", "minilm-l6", "--reader", "L0H1"]) == 0
    assert "(no writer before L0H1: nothing composes into it)" in capsys.readouterr().out
    assert main(["composition", "minilm-l6", "--reader", "L3.mlp", "--top", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)  # an MLP reads by "in", its default as in Composition.top
    assert data["kind"] == "in" and data["baseline"] == pytest.approx(folded.baseline["in"])
    assert [r["writer"] for r in data["rows"]] == list(folded.top("L3.mlp", n=2).writer)
    assert main(["composition", "minilm-l6", "--kind", "o"]) == 1
    assert "--kind" in capsys.readouterr().err
    assert main(["composition", "minilm-l6", "--reader", "L9H9"]) == 1
    err = capsys.readouterr().err  # one line: transformers' loading bar only on a terminal
    assert err.startswith("residual-stream: error: no reader 'L9H9'") and err.count("\n") == 1, err


def test_cli_composition_refuses_an_mlp_kind_on_an_attention_only_model(tmp_path, capsys):
    """On a model without MLPs, an MLP kind without ``--reader`` printed an empty list under a
    baseline made from a made-up MLP size (helper 37); it is refused, and Q/K/V still list.
    Reference: ``Composition.to_frame`` of the same folder loaded by the API."""
    import json

    from residual_stream.twins.model import TwinConfig
    from residual_stream.twins.train import Recipe, save, train

    config = TwinConfig(norm="layernorm", placement="pre", n_layers=2, d_model=32, n_heads=4, d_mlp=64,
                        attn_only=True)
    recipe = Recipe(steps=1, batch=2, warmup=0)
    save(train(config, recipe, progress=False), recipe, tmp_path / "tw")
    for kind in ("in", "mlp_k"):
        assert main(["composition", str(tmp_path / "tw"), "--kind", kind]) == 1
        assert capsys.readouterr().err == (f"residual-stream: error: tw has no MLPs: --kind {kind} has "
                                           "nothing to score; use q, k or v\n")
    assert main(["composition", str(tmp_path / "tw"), "--kind", "q", "--top", "100", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    frame = rs.composition(rs.load(tmp_path / "tw")).to_frame().query("kind == 'q'")
    assert len(rows) == len(frame) == 4 * 4  # layer 1's heads read layer 0's
    assert {(r["writer"], r["reader"]) for r in rows} == set(zip(frame.writer, frame.reader, strict=True))


def test_cli_output_to_a_closed_pipe_ends_quietly():
    """``residual-stream models | head``: when the reader has gone before the command prints,
    the command ends with 0 and says nothing (it said "error: [Errno 32] Broken pipe", exit 1,
    and Python added its own message at exit). The read end is closed before the child has
    even imported the package, so the write always meets a closed pipe."""
    import os
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-m", "residual_stream.cli", "models"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 0 and err == ""


def test_cli_report_compares_saved_scans_without_loading_a_model(tmp_path, monkeypatch):
    """Two twins' scans saved whole: a page of the corpus section alone, its curves the scans'
    own numbers; with models too, both parts."""
    from residual_stream import loading

    stats = ["growth", "survival", "lens:every=2"]
    results = [rs.scan(rs.load(name), "builtin", stats, max_tokens=300, progress=False)
               for name in ("twin-pre-rms", "twin-post-ln")]
    paths = [str(r.save(tmp_path / f"{r.model_name}.pt")) for r in results]
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("a model loaded"))
    html, data = tmp_path / "scans.html", tmp_path / "scans.json"
    assert main(["report", "--scan", paths[0], "--scan", paths[1], "--out", str(html), "--data", str(data),
                 "--title", EVIL, "--quiet"]) == 0
    page, numbers = html.read_text(), json.loads(data.read_text())
    checker = Checker()
    checker.feed(page)
    assert not checker.errors and checker.stack == [] and checker.plots == 5 and EVIL not in page
    assert "id='corpus'" in page and "id='anatomy'" not in page and "id='conservation'" not in page
    labels = ["twin-pre-rms (twin-pre-rms)", "twin-post-ln (twin-post-ln)"]
    assert list(numbers["scans"]) == labels
    for label, result in zip(labels, results, strict=True):
        scan = numbers["scans"][label]
        assert scan["tokens"] == result.tokens == 300
        np.testing.assert_allclose(scan["norm_mean"], result.stats["growth"].mean.numpy(), rtol=1e-6)
        np.testing.assert_allclose(scan["lens_kl"], result.stats["lens:every=2"]["kl"], rtol=1e-6)
        survival = result.stats["survival"]
        np.testing.assert_allclose(scan["embed_retention"],
                                   survival.retention[survival.sources.index("embed")].numpy(), rtol=1e-6)
    monkeypatch.undo()
    both, _ = build_report(twins(), builtin_corpus()[:3], max_tokens=200,
                           scans={"a saved scan": rs.load_scan(paths[0])})
    assert "id='corpus'" in both and "id='anatomy'" in both and "id='conservation'" in both


def test_cli_usage_errors_exit_2():
    with pytest.raises(SystemExit) as e:
        main(["report"])
    assert e.value.code == 2


def test_cli_trace_saves_statistics(tmp_path):
    from safetensors import safe_open

    out = tmp_path / "t.safetensors"
    assert main(["trace", "minilm-l6", "--text", "hello there", "--out", str(out)]) == 0
    with safe_open(str(out), "pt") as f:
        assert f.get_tensor("stream_norm").shape[0] == 7
        assert json.loads(f.metadata()["str_tokens"])[0][0] == "[CLS]"
    assert out.stat().st_mode & 0o777 == usual_mode(tmp_path)  # safetensors' own is 0600


def usual_mode(folder) -> int:
    """The permissions a new file gets in ``folder`` (the reference: one written by Python)."""
    probe = folder / "probe.txt"
    probe.write_text("x")
    return probe.stat().st_mode & 0o777


def test_report_renders_in_chromium(report, tmp_path):
    import shutil
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    from pathlib import Path
    if not Path(chromium).exists():
        pytest.skip("no chromium")
    from playwright.sync_api import sync_playwright
    page_html, _ = report
    path = tmp_path / "report.html"
    path.write_text(page_html)
    errors = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                     args=["--no-sandbox", "--disable-gpu",
                                           "--disable-background-networking"])
        page = browser.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(path.as_uri())
        page.wait_for_timeout(1500)
        rendered = page.locator(".js-plotly-plot .main-svg").count()
        assert page.evaluate("window.__pwned") is None
        browser.close()
    assert rendered >= 14 and not errors, errors


def test_cli_families_lists_every_supported_architecture(capsys):
    """``residual-stream families``: one line per ``config.model_type`` that ``rs.load``
    accepts (``rs.supported_architectures()``), each with its family's description."""
    from residual_stream.cli import main

    assert main(["families"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == rs.supported_architectures()
    by_type = {line.split()[0]: line for line in lines}
    assert "multipliers" in by_type["granite"] and "ALiBi" in by_type["bloom"]
