"""The spec and presets: every runbook workload validates with its published values, and each
known trap is rejected before anything is queued, naming the field and the fix."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pretrain.presets import SpecError, apply_overrides, list_presets, load_spec

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it

RUNBOOK_PRESETS = ["gpt3-6.7b-trn1-16node", "gpt3-7.5b-eks", "gpt3-7.5b-gpu", "llama3-70b", "llama3-70b-cp",
                   "llama3-70b-gpu", "llama3-70b-trn2", "llama3-70b-trn2-torchneuron", "llama3-8b-gpu", "llama3.1-70b",
                   "megatron-gpt-6.7b", "tiny-local"]


def test_every_runbook_workload_has_a_preset_that_validates():
    assert list_presets() == RUNBOOK_PRESETS
    for name in RUNBOOK_PRESETS:
        assert load_spec(name).name == name


@pytest.mark.parametrize("preset, world, dp, accumulation", [
    ("llama3-70b", 512, 2, 512),        # 16 x 32 / (32 x 8)
    ("llama3-70b-trn2", 512, 4, 256),   # 8 x 64 / (32 x 4)
    ("llama3-70b-cp", 512, 1, 1024),    # 16 x 32 / (32 x 8 x 2)
    ("llama3.1-70b", 512, 2, 512),      # the same 16 nodes as Llama 3
    ("gpt3-6.7b-trn1-16node", 512, 64, 16),  # the tutorial script's tp 8
    ("gpt3-7.5b-gpu", 16, 2, 144),
])
def test_derived_parallel_sizes_match_the_runbooks(preset, world, dp, accumulation):
    spec = load_spec(preset)
    assert (spec.world_size, spec.dp, spec.grad_accumulation) == (world, dp, accumulation)


def test_published_values_of_the_70b_presets():
    trn2 = load_spec("llama3-70b-trn2")
    assert trn2.backend.neuron.lnc == 2 and trn2.parallel.kv_replicator == 4
    assert trn2.parallel.pipeline_cuts == ["model.layers.18", "model.layers.39", "model.layers.60"]
    assert load_spec("llama3-70b").backend.neuron.lnc == 1
    llama31 = load_spec("llama3.1-70b")
    assert llama31.model.rope_scaling.factor == 8.0 and llama31.model.max_position_embeddings == 131072
    assert llama31.cluster.nodes == 16 and llama31.model.num_layers == 80


def test_gpt_size_table_fills_the_shape():
    spec = load_spec("gpt3-7.5b-gpu")
    assert (spec.model.num_layers, spec.model.hidden_size, spec.model.num_attention_heads) == (36, 4096, 32)
    bigger = load_spec("gpt3-7.5b-gpu", ["model.size=18.4B", "parallel.tp=8"])
    assert (bigger.model.num_layers, bigger.model.hidden_size) == (40, 6144)
    with pytest.raises(SpecError, match=r"model.size='2B'.*1.7B"):
        load_spec("gpt3-7.5b-gpu", ["model.size=2B"])


def rejected(preset: str, *overrides: str) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(preset, list(overrides))
    return str(info.value)


def test_heads_not_divisible_by_tp():
    message = rejected("llama3-70b", "parallel.tp=6", "parallel.kv_replicator=1")
    assert "parallel.tp=6" in message and "model.num_attention_heads=64" in message
    assert "[1, 2, 4, 8, 16, 32, 64]" in message


def test_attention_heads_that_do_not_fit_the_hidden_size():
    assert "model.hidden_size=130 is not divisible by model.num_attention_heads=4" in rejected(
        "tiny-local", "model.hidden_size=130")
    assert "model.num_kv_heads=3 must divide model.num_attention_heads=4" in rejected(
        "tiny-local", "model.num_kv_heads=3")


def test_global_batch_not_divisible_by_micro_batch_times_dp():
    message = rejected("gpt3-7.5b-gpu", "training.global_batch_size=289")
    assert "training.global_batch_size=289" in message and "micro_batch_size x dp" in message


def test_the_native_trainer_refuses_parallelism_it_does_not_have():
    # It would train with dp and tp alone, and check batch sizes against the wrong dp.
    message = rejected("tiny-local", "parallel.pp=2", "model.num_layers=4", "parallel.sequence_parallel=true")
    assert "parallel.pp=2, parallel.sequence_parallel=True: backend.kind=native trains with data parallel" in message
    assert "parallel.cp=2" in rejected("tiny-local", "parallel.cp=2")
    assert load_spec("tiny-local", ["parallel.tp=2"]).parallel.tp == 2


GPT_NATIVE = ("model.family=gpt", "model.num_kv_heads=null", "model.rope_theta=null")  # tiny-local as GPT-2


def trainer_refuses(tmp_path, model: dict | None = None, parallel: dict | None = None) -> str:
    """The message the trainer's own config (trainer/train/config.py) gives: tiny-local's rendered
    train.json with ``model`` and ``parallel`` values changed, read as the node program reads it."""
    from render.native import train_config
    from trainer.train.config import TrainConfig

    raw = train_config(load_spec("tiny-local"), dataset="/data/d_text_document", run_dir=str(tmp_path), eod_id=0)
    raw["model"].update(model or {})
    raw["parallel"].update(parallel or {})
    path = tmp_path / "train.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError) as info:
        TrainConfig.from_file(path)
    return str(info.value).removeprefix(f"{path}: ")


def test_a_native_gpt_with_tensor_parallelism_is_refused_before_anything_runs(tmp_path):
    """GPT-2's fused c_attn cannot be split by heads: the trainer refused it on the node, after
    fetch and tokenize had run; the spec now asks the trainer's rule."""
    message = rejected("tiny-local", *GPT_NATIVE, "parallel.tp=2")
    assert "parallel.tp=2 needs family=llama" in message and "use parallel.tp=1" in message
    assert trainer_refuses(tmp_path, {"family": "gpt", "num_kv_heads": None}, {"tp": 2}) in message
    assert load_spec("tiny-local", [*GPT_NATIVE, "parallel.tp=1"]).model.family == "gpt"
    # Megatron-LM splits GPT by heads itself
    assert load_spec("gpt3-7.5b-gpu").parallel.tp == 8


def test_pretrain_validate_names_the_field_of_a_native_gpt_with_tensor_parallelism():
    overrides = [arg for o in (*GPT_NATIVE, "parallel.tp=2") for arg in ("--set", o)]
    bad = subprocess.run([sys.executable, "-m", "cli.main", "validate", "tiny-local", *overrides],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "parallel.tp=2 needs family=llama" in bad.stderr, bad.stderr[-2000:]


def test_a_native_gpt_with_grouped_query_attention_is_refused_in_the_trainers_words(tmp_path):
    message = rejected("tiny-local", "model.family=gpt", "model.rope_theta=null")  # 4 heads, 2 KV heads
    refused = trainer_refuses(tmp_path, {"family": "gpt"})
    assert refused.startswith("model.num_kv_heads applies to family=llama only") and refused in message
    assert "set it to model.num_attention_heads=4" in message
    # Megatron-LM's GPT has grouped-query attention (--group-query-attention)
    assert load_spec("gpt3-7.5b-gpu", ["model.num_kv_heads=8"]).model.kv_heads == 8


def test_native_tensor_parallelism_over_kv_heads_is_refused_in_the_trainers_words(tmp_path):
    message = rejected("tiny-local", "parallel.tp=4", "cluster.devices_per_node=4", "training.global_batch_size=4")
    assert trainer_refuses(tmp_path, parallel={"tp": 4}) in message
    assert "model.num_kv_heads=2 is not divisible by parallel.tp=4" in message and "choose tp in [1, 2]" in message


def test_the_spec_and_the_converter_refuse_a_kv_layout_in_the_same_words():
    from trainer.nxdt_layout import LayoutError, NxdtLayout

    for overrides, (kv, tp, mult) in [
            (("parallel.kv_replicator=8", "model.init_from=/fsx/Meta-Llama-3-70B"), (8, 32, 8)),
            (("parallel.kv_replicator=2",), (8, 32, 2)),
            (("parallel.kv_replicator=3",), (8, 32, 3)),
            (("parallel.tp=6", "parallel.kv_replicator=1"), (8, 6, 1))]:
        with pytest.raises(LayoutError) as converter:
            NxdtLayout(80, 64, kv, 128, tp=tp, pp=8, kv_multiplier=mult)
        assert str(converter.value) in rejected("llama3-70b", *overrides)


def test_attention_without_qkv_linear_is_refused_where_nxdt_cannot_build_it():
    """NxDT's Llama without qkv_linear has plain q_proj/k_proj/v_proj layers: no fused QKV, no KV
    replication. The spec and the converter refuse those combinations in the same words."""
    from trainer.nxdt_layout import LayoutError, NxdtLayout

    for overrides, fuse, mult, message in [
            (("model.qkv_linear=false",), True, 4,
             "model.fuse_qkv=true needs model.qkv_linear=true: without it NxDT's Llama ignores fuse_qkv"),
            (("model.qkv_linear=false", "model.fuse_qkv=false"), False, 4,
             "parallel.kv_replicator=4 needs model.qkv_linear=true: with qkv_linear false NxDT's k_proj/v_proj hold "
             "each KV head once and replicate none; set parallel.kv_replicator=1 or model.qkv_linear=true")]:
        with pytest.raises(LayoutError) as converter:
            NxdtLayout(80, 64, 8, 128, tp=32, pp=8, kv_multiplier=mult, fuse_qkv=fuse, qkv_linear=False)
        assert message in str(converter.value) and str(converter.value) in rejected("llama3-70b", *overrides)
    # 8 KV heads over tp 8 need no replication: a layout NxDT builds without qkv_linear.
    spec = load_spec("llama3-70b", ["model.qkv_linear=false", "model.fuse_qkv=false", "parallel.kv_replicator=1",
                                    "parallel.tp=8"])
    assert spec.model.qkv_linear is False


def test_kv_replication_constraints():
    assert "parallel.kv_replicator=3 must divide parallel.tp=32" in rejected(
        "llama3-70b", "parallel.kv_replicator=3")
    message = rejected("llama3-70b", "parallel.kv_replicator=2")
    assert "model.num_kv_heads=8 x parallel.kv_replicator=2" in message and "[4, 8, 16, 32]" in message
    assert "kv_replicator is an NxD setting" in rejected("tiny-local", "parallel.kv_replicator=2")
    # NxD runs two replicated KV heads a rank, but converted weights give each rank one: a run
    # from HF weights is refused here, not in the convert job hours later.
    message = rejected("llama3-70b", "parallel.kv_replicator=8", "model.init_from=/fsx/Meta-Llama-3-70B")
    assert "model.num_kv_heads=8 x kv_replicator must equal parallel.tp=32" in message
    assert "set parallel.kv_replicator=4" in message
    assert load_spec("llama3-70b", ["parallel.kv_replicator=8"]).parallel.kv_replicator == 8


def test_eval_iterations_with_zero_validation_split():
    message = rejected("gpt3-7.5b-gpu", "data.split=100,0,0")
    assert "training.eval_iters=40" in message and "data.split" in message and "eval_iters=0" in message
    assert load_spec("gpt3-7.5b-gpu", ["data.split=100,0,0", "training.eval_iters=0"])


def test_steps_and_samples_both_set():
    message = rejected("gpt3-7.5b-gpu", "training.train_steps=100")
    assert "training.train_steps and training.train_samples are both set" in message


def test_world_size_must_fit_the_model_parallel_layout():
    message = rejected("llama3-70b", "cluster.nodes=3")
    assert "cluster.nodes x cluster.devices_per_node = 3 x 32 = 96" in message
    assert "parallel.tp x parallel.pp x parallel.cp = 32 x 8 x 1 = 256" in message


THREE_NODES = ["cluster.nodes=3", "cluster.devices_per_node=1", "training.micro_batch_size=2",
               "training.global_batch_size=12"]


def test_a_run_shrinks_after_losing_nodes_only_as_far_as_min_nodes():
    """A resubmission asks for every node of cluster.nodes the partition still has healthy, and
    no fewer than cluster.min_nodes; unset, it asks for cluster.nodes whatever is left."""
    shrinking = load_spec("tiny-local", [*THREE_NODES, "cluster.min_nodes=2"])
    assert [shrinking.cluster.nodes_with(healthy) for healthy in (0, 1, 2, 3, 5)] == [2, 2, 2, 3, 3]
    assert [load_spec("tiny-local", THREE_NODES).cluster.nodes_with(healthy) for healthy in (2, 5)] == [3, 3]
    assert "cluster.min_nodes=4 is above cluster.nodes=3" in rejected("tiny-local", *THREE_NODES, "cluster.min_nodes=4")


def test_every_node_count_a_run_may_shrink_to_must_lay_out():
    # 6 = 2 x 3 on three nodes, but not a multiple of 2 x 2 on the two that cluster.min_nodes allows
    message = rejected("tiny-local", *THREE_NODES, "training.global_batch_size=6", "cluster.min_nodes=2")
    assert message.endswith("on 2 node(s), which cluster.min_nodes=2 allows: training.global_batch_size=6 is not "
                            "divisible by training.micro_batch_size x dp = 2 x 2: use a multiple of 4; or raise "
                            "cluster.min_nodes"), message
    message = rejected("tiny-local", "cluster.nodes=4", "cluster.min_nodes=3", "cluster.devices_per_node=1",
                       "parallel.tp=2", "training.global_batch_size=8", "training.micro_batch_size=2")
    assert "on 3 node(s), which cluster.min_nodes=3 allows: world size nodes x cluster.devices_per_node = 3 x 1 = 3 " \
           "is not a multiple of parallel.tp x parallel.pp x parallel.cp = 2 x 1 x 1 = 2" in message
    # NxDT resumes only on the layout that saved its checkpoint
    message = rejected("llama3-70b", "cluster.min_nodes=8")
    assert "only backend.kind=native resumes a run on fewer nodes" in message and "backend.kind=neuron" in message


def test_lnc_belongs_to_trn2():
    assert "trn1 has no logical NeuronCores" in rejected("llama3-70b", "backend.neuron.lnc=2")


def test_typo_and_bad_override_keys_are_named():
    assert "parallel.tensor_parallel: unknown field" in rejected("tiny-local", "parallel.tensor_parallel=2")
    assert "bogus: unknown field" in rejected("tiny-local", "bogus.x=1")
    assert "dotted.key=value" in rejected("tiny-local", "parallel.tp")
    assert "model.family is a value, not a section" in rejected("tiny-local", "model.family.x=1")


def test_unknown_preset_lists_the_available_ones():
    message = rejected("llama9-1t")
    assert "unknown preset 'llama9-1t'" in message and "tiny-local" in message


def test_spec_files_extend_presets_and_name_their_line_on_yaml_errors(tmp_path):
    spec_file = tmp_path / "mine.yaml"
    spec_file.write_text("extends: tiny-local\ntraining:\n  train_steps: 7\n")
    spec = load_spec(str(spec_file))
    assert spec.name == "mine" and spec.training.train_steps == 7 and spec.model.num_layers == 4
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nmodel: [unclosed\n")
    assert f"{broken}:" in rejected(str(broken)) and "invalid YAML" in rejected(str(broken))


def test_a_preset_is_the_preset_whatever_the_current_directory_holds(tmp_path, monkeypatch):
    """llama3-70b-trn2 extends llama3-70b: a folder of that name where the command runs is not it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama3-70b").mkdir()
    (tmp_path / "tiny-local").write_text("name: not-the-preset\n")
    assert load_spec("llama3-70b-trn2").backend.neuron.instance_type == "trn2"
    assert load_spec("llama3-70b").name == "llama3-70b" and load_spec("tiny-local").name == "tiny-local"
    (tmp_path / "mine").write_text("extends: llama3-70b\nname: mine\n")  # a file without .yaml, not a preset
    assert load_spec("mine").backend.neuron.instance_type == "trn1"


def test_overrides_parse_yaml_values():
    data = apply_overrides({"a": {"b": 1}}, ["a.b=null", "a.c=[1, 2]", "d.e=true"])
    assert data == {"a": {"b": None, "c": [1, 2]}, "d": {"e": True}}
    assert load_spec("tiny-local", ["training.train_steps=null", "training.train_samples=640"]).training.train_samples == 640


def test_a_backend_kind_without_its_settings_names_the_section_to_add():
    """Switching backend.kind alone leaves the backend's section empty: the spec says which to add
    (torchtitan's read its missing flavour as an AttributeError before)."""
    with pytest.raises(SpecError, match=r"backend.torchtitan is required for backend.kind=torchtitan "
                                        r"\(at least backend.torchtitan.flavour: one of debugmodel, 1B"):
        load_spec("tiny-local", ["backend.kind=torchtitan"])
    with pytest.raises(SpecError, match=r"backend.neuron is required for backend.kind=neuron"):
        load_spec("tiny-local", ["backend.kind=neuron"])
