"""Row-sparse table updates and table placement (train.table_optimizer, train.table_device)."""

import json

import pytest
import torch
from torch import nn

from plelab.cli import main
from plelab.config import resolve_config
from plelab.model import build_model
from plelab.training.sparse import RowSparseAdamW, clip_with_norm, grad_norm


def _pair(V=12, D=6, seed=0):
    torch.manual_seed(seed)
    table = nn.Embedding(V, D)
    head = nn.Linear(D, 3)
    return table, head


def _optim(table, head, sparse, wd=0.0):
    table.sparse = sparse
    groups = [{"params": list(head.parameters()), "weight_decay": 0.1},
              {"params": [table.weight], "weight_decay": wd, **({"row_sparse": True} if sparse else {})}]
    cls = RowSparseAdamW if sparse else torch.optim.AdamW
    return cls(groups, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, foreach=False)


def _train(sparse, ids_per_step, wd=0.0, clip=None):
    table, head = _pair()
    opt = _optim(table, head, sparse, wd)
    for step, ids in enumerate(ids_per_step):
        for g in opt.param_groups:
            g["lr"] = 1e-2 * (step + 1) / len(ids_per_step)  # a schedule, as in training
        loss = (head(table(ids)) ** 2).mean() + table(ids).sum() * 1e-3
        loss.backward()
        if sparse:
            table.weight.grad = table.weight.grad.coalesce()
        if clip is not None:
            params = list(table.parameters()) + list(head.parameters())
            clip_with_norm(params, clip, grad_norm(params))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return table, head, opt


@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_row_sparse_equals_dense_adamw_when_every_row_is_touched(wd):
    gen = torch.Generator().manual_seed(1)
    steps = [torch.cat([torch.randperm(12, generator=gen), torch.randint(0, 12, (5,), generator=gen)])
             for _ in range(6)]  # every row every step, some twice
    dense_t, dense_h, dense_o = _train(False, steps, wd)
    sparse_t, sparse_h, sparse_o = _train(True, steps, wd)
    torch.testing.assert_close(sparse_t.weight, dense_t.weight, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(sparse_h.weight, dense_h.weight, rtol=1e-6, atol=1e-7)
    for k in ("exp_avg", "exp_avg_sq", "step"):  # same state keys and values as AdamW
        torch.testing.assert_close(sparse_o.state[sparse_t.weight][k], dense_o.state[dense_t.weight][k])


def test_untouched_rows_and_their_moments_are_left_alone():
    steps = [torch.tensor([0, 1, 2, 2]), torch.tensor([3, 4]), torch.tensor([0, 5])]
    table, head = _pair()
    before = table.weight.detach().clone()
    opt = _optim(table, head, True, wd=0.1)
    touched = set()
    for ids in steps:
        (head(table(ids)) ** 2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        touched |= set(ids.tolist())
        untouched = sorted(set(range(12)) - touched)
        assert torch.equal(table.weight[untouched], before[untouched])
        assert not opt.state[table.weight]["exp_avg"][untouched].any()
    assert not torch.equal(table.weight[[0, 1, 2, 3, 4, 5]], before[[0, 1, 2, 3, 4, 5]])
    # row 1 was touched at step 1 only: lazy Adam does not move it at steps 2-3 (dense AdamW would)
    t2, h2 = _pair()
    opt2 = _optim(t2, h2, True, wd=0.1)
    (h2(t2(steps[0])) ** 2).mean().backward()
    opt2.step()
    assert torch.equal(table.weight[1], t2.weight[1])
    assert opt.state[table.weight]["step"].item() == 3


def test_grad_norm_and_clipping_count_sparse_rows_like_a_dense_gradient():
    ids = torch.tensor([0, 3, 3, 7])
    norms, grads = [], []
    for sparse in (False, True):
        table, head = _pair()
        table.sparse = sparse
        (head(table(ids)) ** 2).sum().backward()
        if sparse:
            table.weight.grad = table.weight.grad.coalesce()
        params = [table.weight, *head.parameters()]
        norms.append(grad_norm(params))
        clip_with_norm(params, 0.05, norms[-1])
        grads.append(table.weight.grad.to_dense())
    torch.testing.assert_close(norms[1], norms[0])
    torch.testing.assert_close(grads[1], grads[0])
    assert grads[0].norm() < 0.05 + 1e-6


def _run(tmp_path, name, *extra):
    out = tmp_path / name
    assert main(["train", "--preset", "cpu-tiny", "--steps", "6", "--no-progress", "--out", str(out),
                 "--set", "train.eval_every=3", "--set", "train.checkpoint_every=3", *extra]) == 0
    return out, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_row_sparse_training_run_records_it_and_resumes_exactly(tmp_path):
    _, dense = _run(tmp_path, "dense")
    out, sparse = _run(tmp_path, "sparse", "--table-optimizer", "row-sparse", "--set", "train.diag_every=2")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["train"]["table_optimizer"] == "row-sparse"
    # step 1 starts from zero moments: dense and lazy updates agree until a row is skipped
    assert [r["loss"] for r in sparse[:2]] == pytest.approx([r["loss"] for r in dense[:2]], abs=1e-6)
    assert sparse[-1]["loss"] < sparse[0]["loss"]
    assert all(v is not None and v > 0 for v in sparse[1]["diag"]["grad_table"])  # live diagnostics read it
    # kill after step 5 = resume from step 3's checkpoint: the same curve
    import shutil

    shutil.rmtree(out / "checkpoints" / "step-000006")
    (out / "summary.json").unlink()
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0
    again = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in again] == [r["loss"] for r in sparse]


def test_host_to_device_copy_passes_the_gradient_back():
    from plelab.model.ple import HostToDevice

    rows = torch.randn(5, 3, requires_grad=True)
    out = HostToDevice.apply(rows, torch.device("cpu"))
    (out * torch.arange(3.0)).sum().backward()
    assert torch.equal(out, rows) and torch.equal(rows.grad, torch.arange(3.0).expand(5, 3))


def test_ddp_leaves_the_row_sparse_table_to_the_trainer(tmp_path):
    """Under DDP the table is in DDP's ignore list (the trainer all-gathers its rows instead)."""
    import torch.distributed as dist

    from plelab.distributed import DistInfo
    from plelab.training.parallel import wrap_model

    cfg = resolve_config("cpu-tiny", [], dp=16)
    model = build_model(cfg.model, cfg.ple, seed=0)
    name = "model.embed_tokens_per_layer.weight"
    assert name in dict(model.named_parameters())  # the name the trainer passes
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        wrapped = wrap_model(model, "ddp", DistInfo(world_size=2), torch.device("cpu"), ignore=[name])
        assert name in wrapped.parameters_to_ignore
        table = model.model.embed_tokens_per_layer.weight
        assert all(p is not table for p in wrapped._module_parameters)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("sets, ignored", [
    (["train.table_optimizer=row-sparse"], True),
    (["ple.table=frozen", "train.table_device=cpu"], True),  # a host-side table, even frozen, stays out of DDP
    ([], False),
])
def test_the_trainer_keeps_a_sparse_or_host_side_table_out_of_ddp(sets, ignored, monkeypatch, tiny_data):
    import plelab.training.trainer as trainer_module
    from plelab.runs import make_trainer

    seen = {}

    def spy(model, mode, info, device, ignore=()):
        seen["ignore"] = list(ignore)
        return model

    monkeypatch.setattr(trainer_module, "wrap_model", spy)
    cfg = resolve_config("cpu-tiny", sets, dp=16)
    make_trainer(cfg, tiny_data, None, progress=False, log=lambda *a: None)
    assert seen["ignore"] == (["model.embed_tokens_per_layer.weight"] if ignored else [])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: trunk on the GPU, table on the host")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_table_on_host_under_a_gpu_trunk_gives_the_same_losses(tmp_path, precision):
    sets = ["--set", "train.device=cuda", "--set", f"train.precision={precision}", "--table-optimizer", "row-sparse"]
    _, dev = _run(tmp_path, "dev", *sets)
    _, host = _run(tmp_path, "host", *sets, "--ple-table-device", "cpu")
    for a, b in zip(dev, host):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5 if precision == "fp32" else 1e-3)


def test_table_on_host_config_builds_the_same_model_and_run_on_cpu(tmp_path):
    cfg = resolve_config("cpu-tiny", [], dp=16)
    model = build_model(cfg.model, cfg.ple, seed=3, device="cpu", table_device="cpu")
    ref = build_model(cfg.model, cfg.ple, seed=3, device="cpu")
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))
    _, auto = _run(tmp_path, "auto", "--table-optimizer", "row-sparse")
    out, host = _run(tmp_path, "host", "--table-optimizer", "row-sparse", "--ple-table-device", "cpu")
    assert [r["loss"] for r in host] == [r["loss"] for r in auto]
    assert json.loads((out / "config.json").read_text())["train"]["table_device"] == "cpu"


@pytest.mark.parametrize("sets, needle", [
    (["train.table_optimizer=sparse"], "train.table_optimizer='sparse'"),
    (["train.table_optimizer=row-sparse", "train.parallel=fsdp"], "FSDP2 shards the table densely"),
    (["train.table_optimizer=row-sparse", "train.compile=true"], "sparse gradients and the host-side table"),
    (["train.table_device=cpu", "train.compile=true"], "sparse gradients and the host-side table"),
    (["train.table_device=gpu"], "train.table_device='gpu'"),
])
def test_bad_table_settings_are_one_line_errors(sets, needle, capsys, tmp_path):
    argv = ["train", "--out", str(tmp_path / "x"), "--steps", "1"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_eval_with_a_memory_mapped_table_reproduces_the_runs_validation_loss(tmp_path, capsys):
    from plelab.training.loading import load_for_eval

    out, rows = _run(tmp_path, "run", "--table-optimizer", "row-sparse")
    capsys.readouterr()
    results = []
    for extra in ([], ["--table-in-memory"]):
        assert main(["eval", str(out), "--json", "--no-progress", *extra]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0]["table_memory_mapped"] and not results[1]["table_memory_mapped"]
    for r in results:
        assert r["val_loss"] == pytest.approx(rows[-1]["val_loss"], abs=1e-6)
    model, _ = load_for_eval(out)
    table = model.model.embed_tokens_per_layer.weight
    file = out / "checkpoints" / "step-000006" / "model.safetensors"
    mapped = [line.split()[0].split("-") for line in open("/proc/self/maps") if line.rstrip().endswith(str(file))]
    assert any(int(lo, 16) <= table.data_ptr() < int(hi, 16) for lo, hi in mapped)  # the table lives in the map
    in_memory, _ = load_for_eval(out, mmap_table=False)
    assert torch.equal(in_memory.model.embed_tokens_per_layer.weight, table)
    assert not any(int(lo, 16) <= in_memory.model.embed_tokens_per_layer.weight.data_ptr() < int(hi, 16)
                   for lo, hi in mapped)
    before = file.read_bytes()
    table.data[0].fill_(1.0)  # copy-on-write: the map is private, the file never changes
    assert file.read_bytes() == before
    # the run's micro-batch matters for the i.i.d. null (its draws are seeded per chunk): grad_accum=2 -> 4
    iid, iid_rows = _run(tmp_path, "iid", "--set", "ple.ids=iid", "--set", "train.grad_accum=2")
    capsys.readouterr()
    assert main(["eval", str(iid), "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["val_loss"] == pytest.approx(iid_rows[-1]["val_loss"], abs=1e-6)
    assert main(["eval", str(tmp_path / "nothing")]) == 2
    assert "nothing does not exist" in capsys.readouterr().err
