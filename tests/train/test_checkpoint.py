import json

from pathlib import Path

import pytest
import torch

from llmlab.errors import UserError
from llmlab.model.config import ATTENTION, FFN, OBJECTIVE, POSITION
from llmlab.train.checkpoint import build_model, list_checkpoints, load_checkpoint, save_checkpoint
from tests.conftest import test_configs, tiny_model


@pytest.fixture
def saved(tmp_path):
    from llmlab.data.tokenizer import TOKENIZER
    tok = TOKENIZER.build(TOKENIZER.config({"kind": "byte"}, "tokenizer")).make()
    tok.save(tmp_path / "tok.json")
    model = tiny_model(seed=1, vocab_size=tok.vocab_size)  # the model embeds every id of its tokenizer
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 97, (1, 8)), torch.randint(0, 97, (1, 8))).loss.backward()
    opt.step()
    run = tmp_path / "run"
    paths = [save_checkpoint(run / "checkpoints", step, model, model.spec.to_dict(), {"seed": 1}, tmp_path / "tok.json",
                             state={"tokens_seen": step * 10}, trainer_state={"optimizer": opt.state_dict()}, keep=2)
             for step in (10, 20, 30)]
    return model, run, paths


def test_round_trip_gives_the_same_model(saved):
    model, _, paths = saved
    ckpt = load_checkpoint(paths[-1])
    again = build_model(ckpt, torch.device("cpu"))
    x = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        assert torch.equal(model(x).logits, again(x).logits)
    assert again.lm_head.weight is again.embed.weight  # tying survives
    assert ckpt.state == {"step": 30, "tokens_seen": 300}
    opt_state = ckpt.trainer_state()["optimizer"]
    assert opt_state["state"] and all(isinstance(v["exp_avg"], torch.Tensor) for v in opt_state["state"].values())


KINDS = ([{"attention": c} for c in test_configs(ATTENTION)] + [{"ffn": c} for c in test_configs(FFN)]
         + [{"pos": c} for c in test_configs(POSITION)] + [{"objective": c} for c in test_configs(OBJECTIVE)]
         + [{"norm": {"placement": "post", "kind": "layernorm"}, "bias": True},
            {"parametrization": "mup", "mup_base_width": 16, "tie_embeddings": False}, {"mtp_heads": 1}])


@pytest.mark.parametrize("shape", KINDS, ids=lambda s: "-".join(f"{k}={v.get('kind', v) if isinstance(v, dict) else v}"
                                                                 for k, v in s.items()))
def test_a_checkpoint_is_built_again_without_drawing_its_weights(tmp_path, shape):
    """Every kind comes back from its checkpoint with the saved numbers, and building it draws
    no random weights (they are loaded): the random state is where it was."""
    from torch import nn

    from llmlab.data.tokenizer import TOKENIZER
    tok = TOKENIZER.build(TOKENIZER.config({"kind": "byte"}, "tokenizer")).make()
    tok.save(tmp_path / "tok.json")
    model = tiny_model(seed=3, vocab_size=tok.vocab_size, init_std=0.3, **shape)
    for p in model.parameters():  # biases and norms start at 0 and 1: make every number count
        p.data.add_(torch.randn_like(p) * 0.1)
    path = save_checkpoint(tmp_path / "run" / "checkpoints", 1, model, model.spec.to_dict(), {"seed": 3},
                           tmp_path / "tok.json", state={}, trainer_state={})
    normal = nn.init.normal_
    ckpt = load_checkpoint(path)
    rng = torch.random.get_rng_state()
    again = build_model(ckpt, torch.device("cpu"))
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert nn.init.normal_ is normal  # put back
    want, got = model.state_dict(), again.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    x = torch.randint(0, tok.vocab_size, (2, 10))
    with torch.no_grad():
        assert torch.equal(model.eval()(x).logits, again(x).logits)


def test_weights_missing_from_a_checkpoint_refuse_the_build(saved):
    """A model is built with its weights undrawn only because every one is then loaded: a
    checkpoint that lacks one is refused, never decoded with uninitialised memory."""
    _, _, paths = saved
    ckpt = load_checkpoint(paths[-1])
    del ckpt.weights["blocks.1.ffn.down_proj.weight"]
    with pytest.raises(UserError, match=r"does not match .*missing \['blocks.1.ffn.down_proj.weight'\]"):
        build_model(ckpt, torch.device("cpu"))


def test_keeps_the_last_n_and_leaves_no_temporaries(saved):
    _, run, _ = saved
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_000020", "step_000030"]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp")]


def test_run_dir_resolves_to_the_latest(saved):
    _, run, paths = saved
    assert load_checkpoint(run).path == paths[-1]
    assert load_checkpoint(run / "checkpoints").path == paths[-1]


def test_a_damaged_latest_checkpoint_is_named_not_passed_over_in_silence(saved, tmp_path, capsys):
    """A run directory whose newest checkpoint is damaged loads the newest one that loads, with
    a line naming the damaged one and why. One rule whatever the damage: a file whose size
    the manifest contradicts, or an edit the manifest was made to agree with. With none
    usable, one error names the latest."""
    import shutil

    from llmlab.train.recovery import MANIFEST

    _, run, paths = saved
    run = Path(shutil.copytree(run, tmp_path / "copy"))
    latest, older = run / "checkpoints" / paths[-1].name, run / "checkpoints" / paths[-2].name
    (latest / "model.json").write_text("{}")
    assert load_checkpoint(run).path == older
    err = capsys.readouterr().err
    assert f"passing over {latest}" in err and "model.json is truncated or corrupt" in err and f"using {older}" in err
    # the manifest made to agree with an edit that breaks the schema
    manifest = json.loads((latest / MANIFEST).read_text())
    spec = json.loads((older / "model.json").read_text())
    (latest / "model.json").write_text(json.dumps({**spec, "model": [1, 2]}))
    manifest["files"]["model.json"] = (latest / "model.json").stat().st_size
    (latest / MANIFEST).write_text(json.dumps(manifest))
    assert load_checkpoint(run).path == older
    err = capsys.readouterr().err
    assert f"passing over {latest} (model.json: model must be a mapping" in err
    (older / "model.safetensors").unlink()
    with pytest.raises(UserError, match=rf"^ckpt: {run} has no usable checkpoint: the latest, {latest}, is damaged "
                                        r"\(model.json: model must be"):
        load_checkpoint(run)


def test_missing_path_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"^ckpt: .* does not exist$"):
        load_checkpoint(tmp_path / "nope")


def test_a_directory_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "stuff").mkdir()
    with pytest.raises(UserError, match="is neither a checkpoint"):
        load_checkpoint(tmp_path / "stuff")


def test_truncated_weights_are_refused_and_the_model_untouched(saved):
    _, _, paths = saved
    f = paths[-1] / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="truncated or corrupt"):
        load_checkpoint(paths[-1])
    f.write_bytes(b"\x00" * 64)
    with pytest.raises(UserError, match="truncated or corrupt"):
        load_checkpoint(paths[-1])


def test_incomplete_checkpoint_names_the_missing_file(saved):
    _, _, paths = saved
    (paths[-1] / "model.json").unlink()
    with pytest.raises(UserError, match="missing model.json"):
        load_checkpoint(paths[-1])


def test_mismatched_weights_leave_the_model_unchanged(saved):
    from llmlab.train.checkpoint import load_weights
    _, _, paths = saved
    ckpt = load_checkpoint(paths[-1])
    other = tiny_model(seed=5, d_model=64)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(UserError, match="does not match"):
        load_weights(other, ckpt.weights, ckpt.path)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())


def test_trainer_state_is_loaded_without_unpickling_code(saved, tmp_path):
    import pickle
    _, _, paths = saved

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"optimizer": Evil()}, paths[-1] / "trainer.pt", pickle_module=pickle)
    manifest = paths[-1] / "manifest.json"  # as a forger would: the manifest agrees with the file
    listed = json.loads(manifest.read_text())
    listed["files"]["trainer.pt"] = (paths[-1] / "trainer.pt").stat().st_size
    manifest.write_text(json.dumps(listed))
    with pytest.raises(UserError, match="trainer.pt is unreadable"):
        load_checkpoint(paths[-1]).trainer_state()


def test_the_best_checkpoint_reads_only_finite_numbers(saved):
    """An edited state.json (a string for the validation loss, NaN, a list for the record), its
    manifest made to agree, is not a score: the best is chosen among the finite numbers."""
    from llmlab.train.checkpoint import best_checkpoint
    from llmlab.train.recovery import MANIFEST

    def edit_state(path, text):
        (path / "state.json").write_text(text)
        manifest = json.loads((path / MANIFEST).read_text())
        manifest["files"]["state.json"] = (path / "state.json").stat().st_size
        (path / MANIFEST).write_text(json.dumps(manifest))

    _, run, paths = saved
    root = run / "checkpoints"
    first, second = list_checkpoints(root)
    assert best_checkpoint(root) is None  # none records a validation loss
    state = json.loads((first / "state.json").read_text())
    edit_state(first, json.dumps({**state, "val": {"val/loss": "${oc.env:HOME}"}}))
    edit_state(second, json.dumps({**state, "step": 30, "val": {"val/loss": 2.5}}))
    assert best_checkpoint(root) == second
    edit_state(second, json.dumps({**state, "step": 30, "val": {"val/loss": float("nan")}}))
    assert list_checkpoints(root) == [first, second] and best_checkpoint(root) is None
    edit_state(first, "[1, 2]")
    edit_state(second, json.dumps({**state, "step": 30, "val": {"val/loss": 1.5}}))
    assert best_checkpoint(root) == second


def test_a_checkpoint_whose_state_cannot_be_ranked_is_kept_and_named_once(saved, capsys):
    """Pruning keeps the last ``keep`` and the best; an older checkpoint whose state.json was
    edited into something unreadable might be the best, so it stays, and stderr names it and
    why, once per process. One with no score (saved before any evaluation) goes as before."""
    from llmlab.train.checkpoint import rank_checkpoints
    from llmlab.train.recovery import MANIFEST

    model, run, paths = saved
    root = run / "checkpoints"
    first, second = list_checkpoints(root)  # steps 20 and 30
    (first / "state.json").write_text('{"step": 20, "val": {"val/loss": 2.')  # cut short
    manifest = json.loads((first / MANIFEST).read_text())
    manifest["files"]["state.json"] = (first / "state.json").stat().st_size
    (first / MANIFEST).write_text(json.dumps(manifest))
    assert rank_checkpoints(root) == (None, {first: "its state.json is not JSON"})
    capsys.readouterr()

    def save(step):
        return save_checkpoint(root, step, model, model.spec.to_dict(), {"seed": 1}, run.parent / "tok.json",
                               state={"tokens_seen": step * 10}, keep=2)
    newer = [save(40), save(50)]
    err = capsys.readouterr().err
    assert list_checkpoints(root) == [first, *newer]  # step 30 had no score: pruned
    assert err.count(str(first)) == 1 and "is not JSON" in err and "keep_checkpoints=2" in err
