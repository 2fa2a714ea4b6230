"""``python -m mla`` and the GPU-test skip logic, on the CPU."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import conftest
from mla import __main__ as cli
from mla.testing import hopper_skip_reason


def test_python_m_mla_without_gpu_says_so_and_checks_the_cpu_side():
    proc = subprocess.run([sys.executable, "-m", "mla"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert "CuTe DSL (nvidia-cutlass-dsl): 4.8." in text
    assert "GPU: none" in text and "No Hopper GPU here" in text
    assert "pipeline='auto' -> " in text
    assert text.count("PASS") == 2 and "FAIL" not in text


def test_cpu_check_fails_when_the_merge_is_wrong(monkeypatch, capsys):
    # The self-check must be able to fail: break the merge and it reports FAIL.
    import split_k.merge_ref as merge_ref
    real = merge_ref.merge_partials
    monkeypatch.setattr(merge_ref, "merge_partials", lambda o, lse: (real(o, lse)[0] * 1.01, real(o, lse)[1]))
    assert cli.cpu_check() is False
    assert "FAIL" in capsys.readouterr().out


def test_main_exit_code_follows_the_cpu_check(monkeypatch):
    monkeypatch.setattr(cli, "hopper_skip_reason", lambda: "no CUDA device")
    monkeypatch.setattr(cli, "cpu_check", lambda: False)
    assert cli.main([]) == 1
    monkeypatch.setattr(cli, "cpu_check", lambda: True)
    assert cli.main([]) == 0


def test_main_on_hopper_without_kernel_says_so(monkeypatch, capsys):
    monkeypatch.setattr(cli, "hopper_skip_reason", lambda: None)
    monkeypatch.setattr(cli.pipelines, "available_variants", lambda: [])
    monkeypatch.setattr(cli, "report_environment", lambda: None)
    monkeypatch.setattr(cli, "cpu_check", lambda: True)
    assert cli.main([]) == 0
    assert "no pipeline has a kernel yet" in capsys.readouterr().out


def test_main_on_hopper_with_kernel_runs_the_gpu_check(monkeypatch):
    monkeypatch.setattr(cli, "hopper_skip_reason", lambda: None)
    monkeypatch.setattr(cli.pipelines, "available_variants", lambda: ["2wg"])
    monkeypatch.setattr(cli, "report_environment", lambda: None)
    checked = []
    monkeypatch.setattr(cli, "gpu_check", lambda page_sizes: checked.append(page_sizes) or False)
    assert cli.main([]) == 1
    monkeypatch.setattr(cli, "gpu_check", lambda page_sizes: checked.append(page_sizes) or True)
    assert cli.main(["--page-size", "1", "--page-size", "64"]) == 0
    assert checked == [cli.GPU_CHECK_PAGE_SIZES, (1, 64)]


def test_main_refuses_an_unsupported_page_size(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--page-size", "3"])
    assert exc.value.code == 2 and "invalid choice: 3" in capsys.readouterr().err


def test_gpu_check_pages_and_cases_on_a_fake_gpu(fake_kernel, monkeypatch, capsys):
    """gpu_check's loop (page sizes x cases, names, verdicts) with the kernel replaced by the
    contract's model and CPU tensors; a wrong result must fail it."""
    import mla.testing

    real = mla.testing.make_decode_problem
    monkeypatch.setattr(cli, "make_decode_problem", lambda *a, device, **k: real(*a, device="cpu", **k))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(cli.pipelines, "available_variants", lambda: ["2wg"])
    plan = cli.api.get_mla_metadata
    monkeypatch.setattr(cli.api, "get_mla_metadata", lambda *a: plan(*a, num_sms=132))
    assert cli.gpu_check((1, 64)) is True
    out = capsys.readouterr().out
    assert out.count("PASS") == 2 * len(cli.GPU_CHECK_CASES) * len(cli.GPU_CHECK_SPLIT_CLUSTERS) and "FAIL" not in out
    assert "2wg (page 1 cp.async, s_q 1, h_q 128" in out and "2wg (page 64 TMA, cluster 2, s_q 1, h_q 128" in out
    assert "2wg (page 64 TMA, split cluster 8, s_q 1, h_q 128" in out  # a split cluster: no multicast one
    monkeypatch.setenv("MLA_MULTICAST", "0")
    cli.gpu_check((64,))
    assert ", cluster" not in capsys.readouterr().out
    monkeypatch.delenv("MLA_MULTICAST")
    real_launcher = cli.pipelines.decode_launcher

    def wrong_launcher(*config, **kw):
        launch = real_launcher(*config, **kw)

        def wrong(*args):
            launch(*args)
            args[6].add_(0.1)  # out: far outside the tolerances
        return wrong

    monkeypatch.setattr(cli.pipelines, "decode_launcher", wrong_launcher)
    cli.api.clear_caches()  # launches already looked up for these signatures would skip the wrong one
    assert cli.gpu_check((16,)) is False
    assert cli.gpu_check((3,)) is False  # no page size to check is a failure, not a pass


def test_hopper_skip_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA device" in hopper_skip_reason()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert "sm_80" in hopper_skip_reason() and "A100" in hopper_skip_reason()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert hopper_skip_reason() is None


class FakeItem:
    def __init__(self, keywords):
        self.keywords = keywords
        self.markers = []

    def add_marker(self, marker):
        self.markers.append(marker)


@pytest.mark.parametrize("reason", ["no CUDA device", None])
def test_gpu_marked_tests_skip_without_hopper(monkeypatch, reason):
    monkeypatch.setattr(conftest, "hopper_skip_reason", lambda: reason)
    gpu, cpu = FakeItem({"gpu": True}), FakeItem({})
    conftest.pytest_collection_modifyitems(SimpleNamespace(), [gpu, cpu])
    assert not cpu.markers
    if reason is None:
        assert not gpu.markers
    else:
        (marker,) = gpu.markers
        assert marker.name == "skip" and marker.kwargs["reason"] == reason
