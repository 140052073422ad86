"""Profile rows are used only for the model and sequence length they were measured for."""

import pytest

from hetpp.cli.main import main
from hetpp.cost.compute import CostModel
from hetpp.profile.table import ProfileRow, ProfileTable, load_profiles
from hetpp.specs import Cluster, ModelSpec, TrainSpec
from hetpp.specs.errors import SpecError
from hetpp.specs.presets import PRESETS

CLUSTER = {
    "name": "a100s",
    "nodes": [{"gpu": "A100-80GB", "gpus_per_node": 2, "intra_node_GBps": 300}],
    "inter_node_GBps": 25,
}


def _rows(model: str, seq: int, scale: float = 1.0) -> list[ProfileRow]:
    return [
        ProfileRow("A100-80GB", model, seq, kind, mbs, scale * mbs, 2 * scale * mbs, 10 * mbs)
        for kind in ("embedding", "block", "head")
        for mbs in (1, 2)
    ]


def _cost_model(table: ProfileTable, model: str = "gpt3-350m", seq: int = 1024) -> CostModel:
    spec = ModelSpec(config=PRESETS[model], seq_len=seq)
    train = TrainSpec(global_batch=4, seq_len=seq)
    return CostModel(spec, train, Cluster.model_validate(CLUSTER), table)


def test_only_the_rows_of_this_model_and_length_are_used():
    """Rows at another sequence length sit beside the right ones and must not leak in."""
    table = ProfileTable(_rows("gpt3-350m", 1024) + _rows("gpt3-350m", 512, scale=0.01))
    costs = _cost_model(table).layer_costs(Cluster.model_validate(CLUSTER).gpu(0), 2)
    assert costs.source == "measured"
    assert costs.fwd(1, 2) == pytest.approx(2.0) and costs.bwd(1, 2) == pytest.approx(4.0)


def test_another_models_rows_are_an_error_naming_the_file(tmp_path):
    path = tmp_path / "a100.csv"
    ProfileTable(_rows("gpt3-2.7b", 2048)).save(path)
    with pytest.raises(SpecError) as err:
        _cost_model(load_profiles([path]), "llama2-7b", 2048)
    msg = str(err.value)
    assert str(path) in msg and "gpt3-2.7b at seq_len 2048" in msg
    assert "not llama2-7b at seq_len 2048" in msg


def test_model_names_match_ignoring_case():
    table = ProfileTable(_rows("GPT3-350M", 1024))
    assert len(table.for_model("gpt3-350m", 1024).rows) == 6


def test_plan_with_a_mismatched_profile_exits_2(tmp_path, capsys):
    path = tmp_path / "a100.csv"
    ProfileTable(_rows("gpt3-350m", 2048)).save(path)
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "nodes:\n  - {gpu: A100-80GB, gpus_per_node: 2, intra_node_GBps: 300}\n"
        "inter_node_GBps: 25\n"
    )
    args = ["plan", "--cluster", str(cluster), "--model", "gpt3-350m", "--global-batch", "8"]
    args += ["--seq-len", "1024", "--profile", str(path), "--out", str(tmp_path / "p.json")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "seq_len 2048, not gpt3-350m at seq_len 1024" in err
    assert "Traceback" not in err
