"""Each isolation claim of the grading sandbox, checked by a kernel that tries to break it."""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest
from traitlets.config import Config

from agent_lab.grading import inkernel
from agent_lab.grading.remote import Channel
from agent_lab.grading.session import KernelSession
from autograder import sandbox

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                       reason="the grading sandbox needs root and bubblewrap (make sysdeps)"),
    pytest.mark.xdist_group("autograder"),
]

REPO = Path(__file__).resolve().parents[2]
LIMITS = sandbox.Limits(cpu_seconds=60, memory_bytes=3 << 30, nproc=96, file_bytes=1 << 20,
                        tmpfs_bytes=8 << 20)

PROBE = r'''
import json, os, resource, socket, errno
facts = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
         "cwd": os.getcwd(), "root": sorted(os.listdir("/")), "hostname": socket.gethostname(),
         "etc": sorted(os.listdir("/etc")) if os.path.isdir("/etc") else [],
         "interfaces": [name for _, name in socket.if_nameindex()],
         "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
         "repo": sorted(os.listdir(REPO)) if os.path.isdir(REPO) else None,
         "limits": {name: resource.getrlimit(getattr(resource, "RLIMIT_" + name))[0]
                    for name in ("CPU", "AS", "NPROC", "FSIZE", "CORE")}}
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
facts["caps"] = {k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
facts["no_new_privs"] = status["NoNewPrivs"].strip()
def attempt(action):
    try:
        action()
        return "allowed"
    except Exception as exc:
        return type(exc).__name__
facts["write_src"] = attempt(lambda: open(REPO + "/src/pwned", "w").write("x"))
facts["read_src"] = attempt(lambda: open(REPO + "/src/agent_lab/estimators/returns.py").read())
facts["view"] = sorted(os.path.relpath(os.path.join(d, f), "/opt/agentlab-grading")
                       for d, _, files in os.walk("/opt/agentlab-grading") for f in files)
import glob
kernel_dir = glob.glob("/tmp/agentlab-grade/*/*/kernel.json")
facts["socket_dir_write"] = attempt(lambda: open(os.path.join(os.path.dirname(kernel_dir[0]), "junk"), "w").write("x"))
facts["cgroup"] = open("/proc/self/cgroup").read()
facts["write_venv"] = attempt(lambda: open(REPO + "/.venv/pwned", "w").write("x"))
facts["write_usr"] = attempt(lambda: open("/usr/pwned", "w").write("x"))
facts["read_etc_shadow"] = attempt(lambda: open("/etc/shadow").read())
facts["network"] = attempt(lambda: socket.create_connection(("1.1.1.1", 53), timeout=2))
facts["setuid_root"] = attempt(lambda: os.setuid(0))
facts["big_file"] = attempt(lambda: open("big.bin", "wb").write(b"x" * (2 << 20)))
facts["fill_tmpfs"] = attempt(lambda: [open(f"/tmp/f{i}", "wb").write(b"y" * (900 << 10))
                                      for i in range(20)])
facts["huge_alloc"] = attempt(lambda: bytearray(8 << 30))
import agent_lab, torch
facts["imports"] = [agent_lab.__name__, agent_lab.__version__, torch.__version__]
facts["estimators"] = attempt(lambda: __import__("agent_lab.estimators"))
print("FACTS " + json.dumps(facts))
'''.replace("REPO", repr(str(REPO)))


async def _run(code: str, uid: int, ipc_dir: str, kernel_name: str = "python3",
               cgroup_procs: list[str] | None = None) -> str:
    cfg = Config()
    cfg.SandboxKernelManager.sandbox_uid = uid
    cfg.SandboxKernelManager.ipc_dir = ipc_dir
    cfg.SandboxKernelManager.limit_values = list(vars(LIMITS).values())
    cfg.SandboxKernelManager.cgroup_procs = cgroup_procs or []
    km = sandbox.SandboxKernelManager(config=cfg, kernel_name=kernel_name)
    listener = Channel.listen(km.rpc_path)   # the grading kernel's call server connects here first
    os.chmod(km.rpc_path, 0o666)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    chunks: list[str] = []
    try:
        await kc.wait_for_ready(timeout=120)
        Channel.accept(listener, 60).close()
        km.after_ready()
        await kc.execute_interactive(code, timeout=180, output_hook=lambda m: chunks.append(
            m["content"].get("text", "") + m["content"].get("evalue", "")))
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
    return "".join(chunks)


@pytest.fixture(scope="session")
def facts():
    lease = sandbox.UidLease()
    ipc = str(sandbox.root_dir(sandbox.GRADE_TMP / uuid.uuid4().hex[:12]))
    cgroup = sandbox.KernelCgroup(f"test{lease.uid}", 1.0, LIMITS.memory_bytes, LIMITS.nproc)
    try:
        procs = cgroup.create() if cgroup.kind else []
        # A notebook naming another kernel (here "bash") still gets the sandboxed Python kernel.
        text = asyncio.run(_run(PROBE, lease.uid, ipc, kernel_name="bash", cgroup_procs=procs))
    finally:
        sandbox.reap(lease.uid)
        cgroup.remove()
        shutil.rmtree(ipc, ignore_errors=True)
        lease.release()
    line = next(ln for ln in text.splitlines() if ln.startswith("FACTS "))
    return dict(json.loads(line[6:]), leased_uid=lease.uid, cgroup_kind=cgroup.kind)


def test_kernel_runs_as_the_leased_unprivileged_uid_without_capabilities(facts):
    assert facts["uid"] == facts["euid"] == facts["gid"] == facts["leased_uid"]
    assert facts["leased_uid"] in sandbox.UID_RANGE and facts["groups"] == []
    assert set(facts["caps"].values()) == {"0000000000000000"}
    assert facts["no_new_privs"] == "1"
    assert facts["setuid_root"] == "PermissionError"


def test_kernel_sees_only_its_scratch_the_interpreter_and_the_grading_view(facts):
    assert facts["cwd"] == sandbox.HOME_IN_SANDBOX
    assert set(facts["repo"]) == {".venv"}, "no src/, assignments/, autograder/, tests/ or gradebook"
    assert set(facts["etc"]) <= {"fonts", "localtime"}, "only fontconfig and the time zone"
    assert facts["read_etc_shadow"] == "FileNotFoundError"
    assert facts["read_src"] == "FileNotFoundError", "the library's reference code is not in the sandbox"
    assert facts["imports"][:2] == ["agent_lab", "grading view"]
    assert facts["estimators"] == "ModuleNotFoundError"
    assert facts["view"] == sorted(inkernel.view_files())


def test_kernel_cannot_write_outside_its_scratch(facts):
    for key in ("write_src", "write_venv", "write_usr"):
        assert facts[key] in ("OSError", "FileNotFoundError"), (key, facts[key])  # EROFS or ENOENT
    assert facts["socket_dir_write"] == "PermissionError", "the socket directory is root's once the kernel is up"


def test_every_kernel_process_joins_the_uids_cgroup(facts):
    if facts["cgroup_kind"] is None:
        pytest.skip("no writable cgroup hierarchy with the cpu, memory and pids controllers here")
    assert "/" in facts["cgroup"]  # a cgroup namespace: the kernel sees its own cgroup as the root


def test_kernel_has_no_network_and_no_view_of_host_processes(facts):
    assert facts["interfaces"] == ["lo"]
    assert facts["network"] == "OSError"
    assert facts["hostname"] == "sandbox"
    assert max(facts["pids"]) < 50, "a new PID namespace starts counting at 1"


def test_resource_limits_are_applied(facts):
    assert facts["limits"] == {"CPU": LIMITS.cpu_seconds, "AS": LIMITS.memory_bytes,
                               "NPROC": LIMITS.nproc, "FSIZE": LIMITS.file_bytes, "CORE": 0}
    assert facts["big_file"] == "OSError"        # EFBIG beyond RLIMIT_FSIZE (SIGXFSZ ignored by Python)
    assert facts["fill_tmpfs"] == "OSError"      # ENOSPC: the tmpfs is size-limited
    assert facts["huge_alloc"] == "MemoryError"  # RLIMIT_AS


FORKER = """import os, time

def spawn():
    if os.fork() == 0:  # the child outlives the call, as a fork bomb's children do
        os.setsid()
        time.sleep(600)
        os._exit(0)
    return 1

def answer():
    return 2
"""


def test_processes_a_graded_call_leaves_running_are_stopped_before_the_next_test():
    lease = sandbox.UidLease()
    ipc = str(sandbox.root_dir(sandbox.GRADE_TMP / uuid.uuid4().hex[:12]))

    def manager():
        return sandbox.SandboxKernelManager(sandbox_uid=lease.uid, ipc_dir=ipc,
                                            limit_values=list(vars(LIMITS).values()))

    session = KernelSession(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(FORKER)]), manager)
    try:
        session.run_notebook()
        session.check_server()
        kernel_alone = sandbox.processes_of(lease.uid)
        first = session.ready()
        assert first.call("spawn", (), {}) == 1
        deadline = time.monotonic() + 20
        while len(sandbox.processes_of(lease.uid)) <= len(kernel_alone) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(sandbox.processes_of(lease.uid)) > len(kernel_alone)  # the child is running
        second = session.ready()
        assert second is not first and session.restarts == 1
        assert second.call("answer", (), {}) == 2
        assert len(sandbox.processes_of(lease.uid)) == len(kernel_alone)  # the fresh kernel, nothing else
        assert any("left processes running" in note for note in session.notes), session.notes
        assert session.ready() is second  # a call that leaves nothing behind keeps its kernel
    finally:
        session.close()
        sandbox.reap(lease.uid)
        shutil.rmtree(ipc, ignore_errors=True)
        lease.release()


def test_concurrent_leases_get_distinct_uids_held_by_a_lock_until_released():
    first, second = sandbox.UidLease(), sandbox.UidLease()
    try:
        assert first.uid != second.uid
        fd = os.open(sandbox.LOCK_DIR / f"{first.uid}.lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # another grader cannot take it
            first.release()
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)       # free once released
        finally:
            os.close(fd)
    finally:
        second.release()


def test_reap_kills_every_process_of_a_sandbox_uid_and_refuses_other_uids():
    lease = sandbox.UidLease()
    try:
        procs = [subprocess.Popen(["setpriv", f"--reuid={lease.uid}", f"--regid={lease.uid}",
                                   "--clear-groups", "sleep", "300"]) for _ in range(3)]
        deadline = time.monotonic() + 20  # setpriv changes uid when it runs: on a busy machine, a while after Popen
        while len(sandbox.processes_of(lease.uid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(sandbox.processes_of(lease.uid)) == 3
        sandbox.reap(lease.uid)
        assert sandbox.processes_of(lease.uid) == []
        assert all(p.wait(timeout=5) == -9 for p in procs)
    finally:
        lease.release()
    with pytest.raises(ValueError, match="sandbox uid"):
        sandbox.reap(0)


def test_socket_dirs_are_fresh_private_and_refuse_a_prepared_or_foreign_parent(tmp_path):
    lease = sandbox.UidLease()
    try:
        parent = sandbox.root_dir(sandbox.GRADE_TMP / uuid.uuid4().hex[:12])
        made = Path(sandbox.make_ipc_dir(parent / "k1", lease.uid))
        info = made.stat()
        assert (info.st_uid, info.st_mode & 0o777) == (lease.uid, 0o700)
        with pytest.raises(FileExistsError):
            sandbox.make_ipc_dir(made, lease.uid)            # never reused
        foreign = parent / "foreign"
        foreign.mkdir()
        os.chown(foreign, lease.uid, lease.uid)              # a directory a sandbox user owns
        with pytest.raises(RuntimeError, match="owned by root"):
            sandbox.make_ipc_dir(foreign / "k2", lease.uid)
        (parent / "link").symlink_to(tmp_path)
        with pytest.raises(RuntimeError, match="owned by root"):
            sandbox.root_dir(parent / "link")
        shutil.rmtree(parent)
    finally:
        lease.release()


def test_two_workers_making_the_same_root_directory_at_once_both_get_it(monkeypatch):
    # The first batch on a fresh machine starts its workers together: each sees no directory yet, and the one
    # that creates it second must not fail (it once failed the second student of the batch).
    fresh = sandbox.GRADE_TMP / uuid.uuid4().hex[:12] / "shared"
    sandbox.root_dir(fresh)
    monkeypatch.setattr(Path, "exists", lambda self: False)  # this worker checked before the other made it
    assert sandbox.root_dir(fresh) == fresh
    monkeypatch.undo()
    shutil.rmtree(fresh.parent)


def test_limits_reject_non_positive_values():
    with pytest.raises(ValueError, match="cell_timeout"):
        sandbox.Limits(cell_timeout=0)


def test_bwrap_command_binds_nothing_of_the_repository_but_the_venv_and_the_grading_view():
    cmd = sandbox.bwrap_command(["python"], uid=60001, ipc_dir="/tmp/agentlab-grade/x", limits=LIMITS)
    binds = {cmd[i + 1] for i, arg in enumerate(cmd) if arg in ("--bind", "--ro-bind")}
    view = {str(p) for p in inkernel.view_files().values()}
    inside_repo = {b for b in binds if b.startswith(str(REPO))}
    assert inside_repo <= {sys.prefix} | view and view <= inside_repo
    assert {b for b in binds if cmd[cmd.index(b) - 1] == "--bind"} == {"/tmp/agentlab-grade/x"}
    assert "--unshare-net" in cmd and "--unshare-pid" in cmd and "--die-with-parent" in cmd


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_kernel_cgroups_write_the_caps_for_either_hierarchy(tmp_path, layout, monkeypatch):
    """The file writes of KernelCgroup against a fake cgroup tree (the real v1 tree is used above)."""
    monkeypatch.setattr(sandbox.KernelCgroup, "_own_path", staticmethod(lambda controller: "parent"))
    if layout == "v1":
        for c in sandbox.KernelCgroup.V1:
            (tmp_path / c / "parent").mkdir(parents=True)
            (tmp_path / c / "cgroup.procs").write_text("")
    else:
        (tmp_path / "parent").mkdir()
        (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids")
    cg = sandbox.KernelCgroup("uid60001", 1.5, 1 << 30, 64, root=tmp_path)
    assert cg.kind == layout
    procs = cg.create()
    if layout == "v1":
        folder = tmp_path / "cpu" / "parent" / "agentlab" / "uid60001"
        assert (folder / "cpu.cfs_quota_us").read_text() == "150000"
        assert (tmp_path / "memory" / "parent" / "agentlab" / "uid60001" / "memory.limit_in_bytes").read_text() \
            == str(1 << 30)
        assert len(procs) == 3
    else:
        folder = tmp_path / "parent" / "agentlab" / "uid60001"
        assert (folder / "cpu.max").read_text() == "150000 100000"
        assert (folder / "pids.max").read_text() == "64"
        assert (tmp_path / "parent" / "agentlab" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
        assert procs == [str(folder / "cgroup.procs")]
    assert sandbox.KernelCgroup.detect(tmp_path / "nothing") is None


def test_join_cgroup_argv_puts_the_process_in_the_cgroup_before_it_execs(tmp_path):
    procs = tmp_path / "cgroup.procs"
    argv = sandbox.join_cgroup_argv([str(procs)]) + ["/bin/sh", "-c", "echo $$"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    assert procs.read_text() == out  # the same pid: written, then exec'd
    assert sandbox.join_cgroup_argv([]) == []
