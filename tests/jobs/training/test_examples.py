"""The examples a user copies from run under rrun and reach what they promise."""

import os
import re
import subprocess
import sys

import pytest

from launch import EXAMPLES


def test_numpy_example_trains_the_same_model_on_every_rank():
    result = subprocess.run(
        [sys.executable, "-m", "ringreduce.launcher", "-np", "2", sys.executable,
         os.path.join(EXAMPLES, "numpy_allreduce.py")],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("[0]<stdout>:trained on 8192 samples by 2 ranks")
    assert last.endswith("models identical on all ranks")


def test_synthetic_benchmark_sums_the_ranks_rates():
    result = subprocess.run(
        [sys.executable, "-m", "ringreduce.launcher", "-np", "2", sys.executable,
         os.path.join(EXAMPLES, "pytorch_synthetic_benchmark.py"), "--num-iters", "2", "--num-batches-per-iter", "2",
         "--num-warmup-batches", "1", "--no-cuda"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    lines = [line.split(":", 1)[1] for line in result.stdout.splitlines() if line.startswith("[0]<stdout>:")]
    rates = [float(rate) for rate in re.findall(r"^\[\d\]<stdout>:img/sec per rank: (\d+\.\d) ", result.stdout,
                                                re.M)]  # each rank's, to 0.1
    total = float(lines[-1].rsplit(":", 1)[1])
    assert lines[-1].startswith("total img/sec on 2 rank(s) (cpu): ")
    assert len(rates) == 2 and min(rates) > 0
    assert total == pytest.approx(sum(rates), abs=0.16)  # three roundings to 0.1


@pytest.mark.parametrize("example, learned", [
    # the loss at most halved, the accuracy at least 0.9, the loss a twentieth (measured: 1.37 -> 0.30,
    # 0.60 -> 0.99, 3.93 -> 0.0001)
    ("horovod_torch_migration.py", r"loss (\d+\.\d+) -> (\d+\.\d+); rank \d joined last; "),
    ("horovod_keras_migration.py", r"accuracy (\d+\.\d+) -> (\d+\.\d+); "),
    ("horovod_tf_migration.py", r"loss (\d+\.\d+) -> (\d+\.\d+); "),
])
def test_horovod_scripts_run_with_only_their_import_line_changed(example, learned):
    """Each example is written against Horovod's documented API; its import line names ringreduce."""
    path = os.path.join(EXAMPLES, example)
    with open(path) as f:
        assert sum("ringreduce" in line for line in f if line.startswith(("import", "from"))) == 1
    result = subprocess.run([sys.executable, "-m", "ringreduce.launcher", "-np", "2", sys.executable, path],
                            capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    match = re.search(learned, last)
    assert match, last
    before, after = float(match[1]), float(match[2])
    learned_enough = {"horovod_torch_migration.py": after <= before / 2, "horovod_keras_migration.py": after >= 0.9,
                      "horovod_tf_migration.py": after <= before / 20}
    assert learned_enough[example], (before, after)
    assert last.endswith("every rank holds the same model: True"), last


@pytest.mark.parametrize("example, ranks, says, first, second", [
    # 2 data-parallel groups x 2 tensor-parallel ranks, on the global batch
    (["hybrid_parallel.py"], 4, "2 data-parallel groups x 2 tensor-parallel ranks: test accuracy", 64, 128),
    # 2 stages, 4 micro-batches per batch; 3 stages on 1F1B's schedule
    (["pipeline_parallel.py"], 2, "2 stages, 4 micro-batches, gpipe: test accuracy", 128, 64),
    (["pipeline_parallel.py", "--schedule", "1f1b"], 3, "3 stages, 4 micro-batches, 1f1b: test accuracy", 128, 64),
], ids=["hybrid", "pipeline-gpipe", "pipeline-1f1b"])
def test_model_parallel_examples_train_the_model_one_process_trains(tmp_path, example, ranks, says, first, second):
    """After two epochs the whole weights equal those of one process training the unsplit model on
    the same batches (float tolerance)."""
    pytest.importorskip("torch")
    saved = tmp_path / "weights.pt"
    result = subprocess.run([sys.executable, "-m", "ringreduce.launcher", "-np", str(ranks), sys.executable,
                             os.path.join(EXAMPLES, example[0]), *example[1:], "--epochs", "2", "--save", str(saved)],
                            capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert says in result.stdout
    assert_weights_of_one_process(saved, first, second)


def assert_weights_of_one_process(saved, first, second, epochs=2, batch_size=64):
    """The weights an example saved equal those of one process training its perceptron (64 ->
    first -> second -> 10, seed 0, SGD lr 0.1 momentum 0.9) on the same digits batches."""
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, first), torch.nn.ReLU(), torch.nn.Linear(first, second),
                                torch.nn.ReLU(), torch.nn.Linear(second, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = load_digits()
    x, y = torch.tensor(data.data, dtype=torch.float32) / 16.0, torch.tensor(data.target)
    train_x, _, train_y, _ = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    for epoch in range(epochs):
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(epoch))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            batch = order[start:start + batch_size]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(train_x[batch]), train_y[batch]).backward()
            optimizer.step()
    got = torch.load(saved)
    assert sorted(got) == sorted(model.state_dict())
    for name, value in model.state_dict().items():
        torch.testing.assert_close(got[name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_the_elastic_example_goes_on_after_a_rank_is_killed(tmp_path):
    """examples/pytorch_elastic.py under an elastic rrun on this one machine, with no cool-down: one
    of its ranks is killed after the second epoch; its host answers, so the job goes on there at
    2 ranks from the last commit and ends trained."""
    import psutil

    script = os.path.join(EXAMPLES, "pytorch_elastic.py")
    stderr = open(tmp_path / "stderr", "w+")
    job = subprocess.Popen(
        [sys.executable, "-m", "ringreduce.launcher", "-np", "2", "--min-np", "1", "--max-np", "2",
         "--host-discovery-script", os.path.join(EXAMPLES, "discover_hosts.sh"), sys.executable, script],
        stdout=subprocess.PIPE, stderr=stderr, text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    lines = []
    try:
        for line in job.stdout:
            lines.append(line.strip())
            if "epoch 2:" in line and len([ln for ln in lines if "epoch 2:" in ln]) == 1:
                ranks = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[-1:] == [script]
                         and not any(word.startswith("ringreduce.launcher") for word in p.info["cmdline"])]
                assert len(ranks) == 2, ranks  # the ranks themselves, not rrun or their wrappers
                ranks[-1].kill()
        job.wait(timeout=150)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
    stderr.seek(0)
    errors = stderr.read()
    assert job.returncode == 0, errors[-3000:]
    assert "failed first: killed by signal 9 (SIGKILL)" in errors and "rrun: generation 1: 2 ranks" in errors
    assert "rrun: localhost answers: its ranks start there again" in errors and "aside" not in errors
    assert re.search(r"rrun: resumed from commit \d+ on 2 ranks", errors), errors[-2000:]
    last = lines[-1]
    assert last.startswith("[0]<stdout>:epoch 8: test accuracy ") and float(last.split()[-4]) > 0.9, last
