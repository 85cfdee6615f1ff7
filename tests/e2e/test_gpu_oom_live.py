"""A real run whose log says CUDA ran out of memory ends as `gpu_oom` (the node helper reads its log's tail
when it fails), with the line in its events."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Hs

FLEET = '[[node]]\nname = "here"\n[node.simulate]\nmodel = "NVIDIA A100-SXM4-80GB"\ncount = 1\n'


def test_a_cuda_oom_in_the_log_is_gpu_oom(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    h = Hs(tmp_path / "home", fleet=fleet)
    try:
        oom = h.run("submit", "--parsable", "--gpus", "1", "--", "sh", "-c",
                    'echo step 1; echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"; '
                    "exit 1", check=True).stdout.strip()
        plain = h.run("submit", "--parsable", "--gpus", "1", "--", "sh", "-c", "echo bad input; exit 1",
                      check=True).stdout.strip()
        h.run("wait", oom, plain, "--timeout", "120")
        a, b = h.json("show", oom), h.json("show", plain)
        assert (a["state"], a["reason"]) == ("FAILED", "gpu_oom"), a  # type: ignore[index]
        assert (b["state"], b["reason"]) == ("FAILED", "nonzero_exit"), b  # type: ignore[index]
        assert any("CUDA out of memory" in e["message"] for e in a["events"])  # type: ignore[index]
    finally:
        h.stop()
