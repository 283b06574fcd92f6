"""A cell that runs out of GPU memory is told why, under the error (serverext/oomnote.py).

Issue 36 item 4: on a shared GPU a cell met CUDA out of memory "and no word about why". The
real jupyter server with the extension and a real ipykernel; GPU readings from the simulated
source (this machine has no GPU). The kernel raises the error PyTorch raises, by name and text.
"""

from __future__ import annotations

import json
import uuid

import pytest

from fracspawner.serverext.oomnote import OomView, explain, is_gpu_oom
from tests.test_culler_support import JupyterServer, wait_for
from tests.test_serverext import gpu_when, new_kernel, write_gpu

TORCH_OOM = (
    "class OutOfMemoryError(RuntimeError):\n"
    "    pass\n"
    "raise OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.50 GiB is free.')"
)
V1 = "v1.kernel.websocket.jupyter.org"


def test_the_frameworks_gpu_out_of_memory_errors_are_recognised():
    assert is_gpu_oom("OutOfMemoryError", "CUDA out of memory. Tried to allocate 20.00 MiB")
    assert is_gpu_oom("RuntimeError", "CUDA error: out of memory")
    assert is_gpu_oom("OutOfMemoryError", "Out of memory allocating 1,024 bytes")  # CuPy
    assert is_gpu_oom("XlaRuntimeError", "RESOURCE_EXHAUSTED: Out of memory while trying to")
    assert is_gpu_oom("ResourceExhaustedError", "OOM when allocating tensor with shape[8192]")
    assert is_gpu_oom("CUDARuntimeError", "cudaErrorMemoryAllocation: out of memory")
    assert is_gpu_oom("CudaAPIError", "[2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY")
    # host memory, and errors that merely mention memory, are not the GPU's
    assert not is_gpu_oom("MemoryError", "")
    assert not is_gpu_oom("ValueError", "memory must be positive")


def view(**kw) -> OomView:
    base = dict(
        slice_label="1/4 H100 · 20 GiB", slice_mib=20389, virtualised=False, shares_device=True,
        total_mib=81559.0, used_mib=80000.0, own_mib=12000.0, free_by_culler_mib=None,
        unavailable=None,
    )  # fmt: skip
    return OomView(**{**base, **kw})


def test_the_note_says_whose_memory_filled_the_gpu():
    shared = explain(view())
    assert "The GPU is shared and its memory is not reserved per server" in shared
    assert "1.5 GiB of its 79.6 GiB was free" in shared
    assert "this server's processes held 11.7 GiB, other servers' 66.4 GiB" in shared
    assert "Your server's slice is 1/4 H100 · 20 GiB." in shared
    assert "more than its slice" not in shared
    over = explain(view(own_mib=30000.0))
    assert "This server holds more than its slice's 19.9 GiB." in over
    # HAMi-core: the pod's NVML is its slice; at the limit it is the slice that ran out
    hami = explain(view(virtualised=True, shares_device=False, total_mib=20389.0, used_mib=20000.0))
    assert "It is your slice's limit: this server holds 19.5 GiB of its 19.9 GiB" in hami
    assert "ask for one when you next start your server" in hami
    below = explain(
        view(virtualised=True, shares_device=False, total_mib=20389.0, used_mib=8192.0,
             free_by_culler_mib=1200.0)
    )  # fmt: skip
    assert "This server holds 8 GiB of its slice's 19.9 GiB" in below
    assert "had 1.2 GiB free by the culler's last count" in below
    whole = explain(view(slice_label="A100 MIG 1g.10gb", shares_device=False, total_mib=9728.0,
                         used_mib=9700.0, own_mib=9700.0))  # fmt: skip
    assert "This server's processes hold 9.5 GiB of the GPU's 9.5 GiB (28 MiB free" in whole
    unknown = explain(view(unavailable="NVML is not installed", total_mib=None, used_mib=None))
    assert "no GPU reading (NVML is not installed), so it cannot say whose memory" in unknown
    assert "Your server's slice is 1/4 H100 · 20 GiB." in unknown


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("oom-note")
    gpu_file = tmp / "gpu.json"
    gpu_file.write_text("{}")
    s = JupyterServer(tmp, gpu_file, entitlement=20389, env={"FRACSPAWNER_GPU_SLICE": "1/4"})
    try:
        yield s
    finally:
        s.stop()


async def run_cell(server: JupyterServer, kernel_id: str, code: str, protocol: str) -> list:
    """Run `code` over the kernel's websocket, as JupyterLab does (`protocol` v1, its binary
    one) or as older clients do ("json"); return [(msg_type, content)] under the request."""
    from jupyter_server.services.kernels.connection.base import (
        deserialize_msg_from_ws_v1,
        serialize_msg_to_ws_v1,
    )
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    url = server.url.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
    request = HTTPRequest(url, headers={"Authorization": f"token {server.token}"})
    v1 = protocol == V1
    conn = await websocket_connect(request, subprotocols=[V1] if v1 else None)
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
              "session": uuid.uuid4().hex, "version": "5.3", "date": ""}  # fmt: skip
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {},
               "allow_stdin": False, "stop_on_error": True}  # fmt: skip
    if v1:
        parts = [json.dumps(p).encode() for p in (header, {}, {}, content)]
        conn.write_message(serialize_msg_to_ws_v1(parts, "shell"), binary=True)
    else:
        whole = {"header": header, "parent_header": {}, "metadata": {}, "content": content}
        conn.write_message(json.dumps({**whole, "channel": "shell", "buffers": []}))
    seen: list = []
    while True:  # until the kernel is idle: the note goes right after the error, before it
        raw = await conn.read_message()
        if raw is None:
            raise RuntimeError("kernel websocket closed")
        if v1:
            channel, parts = deserialize_msg_from_ws_v1(raw)
            fields = ("header", "parent_header", "metadata", "content")
            msg = {
                "channel": channel,
                **{f: json.loads(p) for f, p in zip(fields, parts[:4], strict=True)},
            }
        else:
            msg = json.loads(raw)
        if msg["parent_header"].get("msg_id") != msg_id or msg["channel"] != "iopub":
            continue
        seen.append((msg["header"]["msg_type"], msg["content"]))
        if seen[-1][0] == "status" and seen[-1][1]["execution_state"] == "idle":
            break
    conn.close()
    return seen


@pytest.mark.parametrize("protocol", [V1, "json"])
async def test_a_cell_out_of_gpu_memory_on_a_shared_gpu_is_told_whose_memory(server, protocol):
    kid = new_kernel(server)
    # the GPU: 80,000 of 81,559 MiB used, this server's kernel holding 12,000 of it
    write_gpu(server, {"devices": [{"memory_total_mib": 81559, "memory_used_mib": 80000}],
                       "kernels": {kid: {"memory_mib": 12000}}})  # fmt: skip
    gpu_when(server, lambda r: r.get("gpu_memory_mib") == 12000, "the kernel's reading")
    seen = await run_cell(server, kid, TORCH_OOM, protocol)
    kinds = [k for k, _ in seen]
    assert "error" in kinds, seen
    notes = [c["text"] for k, c in seen if k == "stream" and c["name"] == "stderr"]
    assert len(notes) == 1 and kinds.index("stream") > kinds.index("error"), seen
    (note,) = notes
    assert note.startswith("fracspawner: this cell ran out of GPU memory.")
    assert "this server's processes held 11.7 GiB, other servers' 66.4 GiB" in note
    assert "Your server's slice is 1/4" in note
    # the kernel's own error reaches the notebook unchanged
    error = next(c for k, c in seen if k == "error")
    assert error["ename"] == "OutOfMemoryError" and "CUDA out of memory" in error["evalue"]


async def test_other_errors_get_no_note(server):
    kid = new_kernel(server)
    write_gpu(server, {"devices": [{"memory_total_mib": 81559, "memory_used_mib": 80000}],
                       "kernels": {kid: {"memory_mib": 12000}}})  # fmt: skip
    gpu_when(server, lambda r: any(k["id"] == kid for k in r["kernels"]), "the kernel's reading")
    seen = await run_cell(server, kid, "raise MemoryError('host memory')", V1)
    assert [k for k, _ in seen if k in ("error", "stream")] == ["error"], seen
    # and a cell that prints goes on as before
    seen = await run_cell(server, kid, "print('fine')", V1)
    assert ("stream", {"name": "stdout", "text": "fine\n"}) in seen
    wait_for(lambda: server.process.poll() is None, 1, "the server still up")


async def test_a_server_without_a_gpu_adds_nothing(tmp_path):
    # a CPU-only server (no slice in its environment, no GPU reading): an error named like a GPU
    # one is not about a GPU of this server's
    s = JupyterServer(tmp_path, tmp_path / "gpu.json", entitlement=None, source="none")
    try:
        assert s.gpu()["available"] is False
        seen = await run_cell(s, new_kernel(s), TORCH_OOM, V1)
        assert [k for k, _ in seen if k in ("error", "stream")] == ["error"], seen
    finally:
        s.stop()
