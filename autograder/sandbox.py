"""The grading sandbox: a Jupyter kernel that runs student code in bubblewrap as an unprivileged user.

Why bubblewrap (``bwrap``) and not hand-made checks: it is the small, audited sandbox that Flatpak
uses; it gives us fresh mount, PID, network, IPC and UTS namespaces, so the kernel sees only the
paths we bind, cannot see or signal other processes, and has no network at all (only a private
loopback).  Because the kernel then cannot reach the grader over TCP, the kernel and the grader talk
ZeroMQ over unix sockets (jupyter_client's ``ipc`` transport) in a small directory that is bound
into the sandbox.

Inside bwrap, ``setpriv`` drops to a per-worker uid with no capabilities and ``no_new_privs``,
and ``prlimit`` sets the CPU-time, address-space, process-count and file-size limits.  Each
concurrent sandbox gets its own uid (a lock file per uid), so the process-count limit, which the
kernel counts per uid, never lets one student's fork bomb starve another student's kernel.  Every
process of a sandbox also joins that uid's cgroup (:class:`KernelCgroup`): a cap on CPU (one core by
default), memory and tasks for all of them together, which ``setsid`` or a double fork cannot leave.

What the kernel sees: ``/usr`` (read-only), ``/etc/fonts`` and ``/etc/localtime`` (read-only), the
Python installation and the virtual environment (read-only), the grading view of ``agent_lab``
(read-only: :mod:`agent_lab.grading.inkernel.kernel_view`, the checks and the call server; none of the
library's reference code), a fresh ``/proc`` and ``/dev``, its socket directory, and two
size-limited tmpfs mounts: ``/tmp`` and its working directory ``/home/student``.  Nothing else of the
repository (no ``src/``, no ``assignments/source``, no gradebook, no other submission) exists in its
mount namespace.  Once the kernel has bound its sockets, its socket directory (a host directory) is
handed to root, so the kernel can no longer write anything that outlives the sandbox.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import stat
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from traitlets import Integer, List, Unicode

from agent_lab.grading import inkernel
from agent_lab.grading.inkernel import kernel as grading_kernel

REPO = Path(__file__).resolve().parent.parent
BWRAP = shutil.which("bwrap") or "/usr/bin/bwrap"
HOME_IN_SANDBOX = "/home/student"
UID_RANGE = range(60001, 60001 + 256)
GRADE_TMP = Path("/tmp/agentlab-grade")      # root-owned; per-worker socket roots live here
LOCK_DIR = GRADE_TMP / "locks"
ETC_READABLE = ("/etc/fonts", "/etc/localtime")  # the only host configuration the kernel sees
VIEW_IN_SANDBOX = "/opt/agentlab-grading"         # the kernel's PYTHONPATH: the grading view of agent_lab
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Limits:
    """Resource limits for one student's kernel (all per process except ``nproc``, which is per uid)."""

    cpu_seconds: int = 900          # RLIMIT_CPU: a busy loop dies after this much CPU time
    memory_bytes: int = 4 << 30     # RLIMIT_AS: torch reserves ~1.5 GiB of address space at import
    nproc: int = 128                # RLIMIT_NPROC: threads count too (torch, zmq, ipykernel)
    file_bytes: int = 32 << 20      # RLIMIT_FSIZE: largest file the kernel may write
    tmpfs_bytes: int = 128 << 20    # size of /tmp and of the working directory
    cell_timeout: int = 300         # seconds of wall time per cell
    notebook_timeout: int = 1500    # seconds of wall time for the whole notebook, kernel restarts included

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")


def check_available() -> None:
    """Raise RuntimeError with a fix when the sandbox cannot run on this machine."""
    if os.geteuid() != 0:
        raise RuntimeError(
            "the grading sandbox must be started as root (bubblewrap binds the Python installation "
            "and then drops to an unprivileged uid); run `make grade` with sudo"
        )
    for tool in (BWRAP, "setpriv", "prlimit"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} not found: install bubblewrap and util-linux (make sysdeps)")


class UidLease:
    """Hold an exclusive uid from ``UID_RANGE`` while a sandbox runs (a flock per uid).

    Locks are per uid and released when the holder exits, even on a crash, so concurrent grading
    runs (two terminals, pytest-xdist) never share a uid; a uid that still has processes (left by
    a grader that was killed) is skipped.
    """

    def __init__(self) -> None:
        root_dir(LOCK_DIR)
        for uid in UID_RANGE:
            # O_NOFOLLOW: never follow a planted link while running as root.
            fd = os.open(LOCK_DIR / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            if processes_of(uid):  # a grader that died left a sandbox running: skip its uid
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            return
        raise RuntimeError(f"all {len(UID_RANGE)} sandbox uids are in use")

    def release(self) -> None:
        os.close(self._fd)


def root_dir(path: str | os.PathLike) -> Path:
    """Create (if needed) and verify a directory only root can write: no link, owner 0, mode 0755.

    The grader runs as root; a directory under /tmp that someone else made or can write into could
    redirect its writes (connection files, locks) through planted symlinks.
    """
    path = Path(path)
    for part in [*reversed(path.parents[:-1]), path]:
        try:
            part.mkdir(mode=0o755)
        except FileExistsError:  # made earlier, or just now by a worker grading beside this one
            pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise RuntimeError(f"{path} must be a directory owned by root and writable only by root")
    return path


def processes_of(uid: int) -> list[int]:
    """Live PIDs whose real uid is ``uid`` (sandboxed processes are visible from the host's /proc).

    Zombies are left out: they have exited and only wait for their parent to collect them.
    """
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue  # the process ended while we looked
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
            pids.append(int(entry))
    return pids


def reap(uid: int, timeout: float = 15.0) -> None:
    """SIGKILL every process of a leased sandbox uid and wait until none is left.

    Killing bwrap ends its PID namespace, but the kernel tears it down asynchronously; a fork bomb's
    leftovers would still count against the uid's process limit when the next kernel starts.
    Only uids from ``UID_RANGE`` (leased by this grader) are accepted.
    """
    if uid not in UID_RANGE:
        raise ValueError(f"uid must be a sandbox uid in {UID_RANGE}, got {uid}")
    deadline = time.monotonic() + timeout
    while True:
        pids = processes_of(uid)
        if not pids:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"sandbox uid {uid} still has processes {pids[:10]} after {timeout} s")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _ancestors(path: str) -> list[str]:
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def readonly_paths() -> list[str]:
    """Paths the kernel needs to read: the interpreter and the venv (not the package sources)."""
    paths = {sys.base_prefix, sys.prefix}
    return sorted(p for p in paths if not p.startswith("/usr/"))


def bwrap_command(kernel_argv: list[str], *, uid: int, ipc_dir: str, limits: Limits) -> list[str]:
    """Wrap ``kernel_argv`` in bwrap + setpriv + prlimit.

    The returned argv runs ``kernel_argv`` as ``uid`` (no capabilities, no_new_privs) in new mount,
    PID, network, IPC, UTS and cgroup namespaces.  ``ipc_dir`` is bound read-write at the same path
    so the unix sockets and the connection file are shared with the grader.
    """
    cmd = [BWRAP, "--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc",
           "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox", "--clearenv",
           "--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        target = os.readlink(f"/{link}") if os.path.islink(f"/{link}") else None
        if target:
            cmd += ["--symlink", target, f"/{link}"]
        elif os.path.isdir(f"/{link}"):
            cmd += ["--ro-bind", f"/{link}", f"/{link}"]
    cmd += ["--perms", "0755", "--dir", "/etc"]
    for path in ETC_READABLE:  # fontconfig (matplotlib writes an error to stderr without it), tz
        if os.path.exists(path):
            cmd += ["--ro-bind", path, path]
    cmd += ["--proc", "/proc", "--dev", "/dev",
            "--size", str(limits.tmpfs_bytes), "--perms", "1777", "--tmpfs", "/tmp",
            "--perms", "0755", "--dir", "/home"]
    made: set[str] = {"/home", "/tmp"}
    view = {f"{VIEW_IN_SANDBOX}/{dest}": str(src) for dest, src in inkernel.view_files().items()}
    for path in readonly_paths() + [ipc_dir] + list(view):
        for parent in _ancestors(path):
            if parent not in made:
                cmd += ["--perms", "0755", "--dir", parent]
                made.add(parent)
    for path in readonly_paths():
        cmd += ["--ro-bind", path, path]
    for dest, src in view.items():
        cmd += ["--ro-bind", src, dest]
    # The working directory is a tmpfs of its own; mode 1777 because bwrap mounts it as root.
    cmd += ["--bind", ipc_dir, ipc_dir,
            "--size", str(limits.tmpfs_bytes), "--perms", "1777", "--tmpfs", HOME_IN_SANDBOX]
    env = {"HOME": HOME_IN_SANDBOX, "USER": "student", "LOGNAME": "student",
           "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "LANG": "C.UTF-8",
           "MPLBACKEND": "Agg", "MPLCONFIGDIR": f"{HOME_IN_SANDBOX}/.mpl",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONHASHSEED": "0",  # as the Makefile sets it: grading is reproducible
           "PYTHONPATH": VIEW_IN_SANDBOX, "NBGRADER_EXECUTION": "autograde"}
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    # setpriv needs CAP_SETUID/CAP_SETGID inside bwrap; it then clears every capability set.
    cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--chdir", HOME_IN_SANDBOX, "--",
            "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--",
            "prlimit", f"--cpu={limits.cpu_seconds}", f"--as={limits.memory_bytes}",
            f"--nproc={limits.nproc}", f"--fsize={limits.file_bytes}", "--core=0", "--"]
    return cmd + kernel_argv


def join_cgroup_argv(procs_files: list[str]) -> list[str]:
    """A prefix that writes its own pid into each ``cgroup.procs`` file, then execs the rest of the argv."""
    if not procs_files:
        return []
    code = ("import os, sys; i = sys.argv.index('--'); "
            "[open(p, 'w').write(str(os.getpid())) for p in sys.argv[1:i]]; os.execvp(sys.argv[i + 1], sys.argv[i + 1:])")
    return [sys.executable, "-I", "-c", code, *procs_files, "--"]


class KernelCgroup:
    """One cgroup (per controller under cgroup v1, one node under v2) capping a sandbox uid's processes together.

    ``cpus`` cores of CPU time (a CFS quota), ``memory_bytes`` of memory and ``tasks`` processes and threads.
    Children inherit the cgroup and an unprivileged process cannot move out of it, so processes started with
    ``setsid`` or a double fork stay capped.  :meth:`detect` says which hierarchy this machine offers; without
    one the grader still runs, with the per-process rlimits only, and says so.
    """

    V1 = ("cpu", "memory", "pids")

    def __init__(self, name: str, cpus: float, memory_bytes: int, tasks: int, root: Path = CGROUP_ROOT) -> None:
        self.name, self.cpus, self.memory_bytes, self.tasks, self.root = name, cpus, memory_bytes, tasks, root
        self.kind = self.detect(root)
        self.dirs: list[Path] = []

    @staticmethod
    def _own_path(controller: str) -> str:
        """This process's cgroup path for ``controller`` ("" for the unified hierarchy)."""
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(",") or (controller == "" and names == ""):
                return path.lstrip("/")
        return ""

    @classmethod
    def detect(cls, root: Path = CGROUP_ROOT) -> str | None:
        """"v2", "v1" or None (no usable cgroup hierarchy with the cpu, memory and pids controllers)."""
        controllers = root / "cgroup.controllers"
        if controllers.exists():
            have = set(controllers.read_text().split())
            return "v2" if {"cpu", "memory", "pids"} <= have and os.access(root, os.W_OK) else None
        if all((root / c / "cgroup.procs").exists() and os.access(root / c, os.W_OK) for c in cls.V1):
            return "v1"
        return None

    def create(self) -> list[str]:
        """Make the cgroup and set its caps; return the ``cgroup.procs`` files a process joins through.

        Raises ``OSError`` when the hierarchy refuses (the caller then grades without cgroups and says so).
        """
        period = 100_000
        quota = max(1000, int(self.cpus * period))
        if self.kind == "v1":
            settings = {"cpu": {"cpu.cfs_period_us": period, "cpu.cfs_quota_us": quota},
                        "memory": {"memory.limit_in_bytes": self.memory_bytes},
                        "pids": {"pids.max": self.tasks}}
            for controller, values in settings.items():
                self.dirs.append(self._make(self.root / controller / self._own_path(controller), values))
        elif self.kind == "v2":
            base = self.root / self._own_path("")
            enable = "+cpu +memory +pids"
            (base / "cgroup.subtree_control").write_text(enable)
            (base / "agentlab").mkdir(exist_ok=True)
            (base / "agentlab" / "cgroup.subtree_control").write_text(enable)
            self.dirs.append(self._make(base, {"cpu.max": f"{quota} {period}", "memory.max": self.memory_bytes,
                                               "pids.max": self.tasks}))
        return [str(d / "cgroup.procs") for d in self.dirs]

    def _make(self, base: Path, values: dict) -> Path:
        folder = base / "agentlab" / self.name
        folder.mkdir(parents=True, exist_ok=True)
        for key, value in values.items():
            (folder / key).write_text(str(value))
        return folder

    def remove(self) -> None:
        """Remove the cgroup (call after :func:`reap`: a cgroup with processes cannot be removed)."""
        for folder in self.dirs:
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last processes are still being torn down
                    time.sleep(0.05)
        self.dirs = []


class SandboxKernelManager(AsyncKernelManager):
    """A kernel manager whose every kernel runs in the sandbox, whatever kernel the notebook names.

    The kernelspec is built here and never looked up, so a submission cannot pick an unsandboxed
    kernel through its ``kernelspec`` metadata.  Interrupts are sent as messages (the bwrap process
    between the grader and the kernel would not forward SIGINT).  Each kernel gets a fresh,
    randomly named socket directory inside ``ipc_dir`` (a root-owned directory), so files a previous
    kernel left behind (say, a symlink named like the connection file) are never written through.
    """

    sandbox_uid = Integer(0, config=True, help="uid the kernel runs as (a leased, unprivileged uid)")
    ipc_dir = Unicode("", config=True, help="root-owned directory for the per-kernel socket dirs")
    limit_values = List(Integer(), default_value=[], config=True,
                        help="Limits fields in order (empty: defaults)")
    cgroup_procs = List(Unicode(), default_value=[], config=True,
                        help="cgroup.procs files the kernel joins before bwrap starts (KernelCgroup.create)")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.sandbox_uid not in UID_RANGE or not self.ipc_dir:
            raise ValueError(
                f"SandboxKernelManager needs sandbox_uid in {UID_RANGE} and ipc_dir, got "
                f"{self.sandbox_uid!r} and {self.ipc_dir!r}"
            )
        root_dir(self.ipc_dir)
        self.kernel_dir = make_ipc_dir(Path(self.ipc_dir) / uuid.uuid4().hex[:10], self.sandbox_uid)
        self.transport = "ipc"
        self.ip = os.path.join(self.kernel_dir, "k")
        self.connection_file = os.path.join(self.kernel_dir, "kernel.json")
        self.rpc_path = os.path.join(self.kernel_dir, "rpc")  # the grader listens here (agent_lab.grading)
        limits = Limits(*self.limit_values) if self.limit_values else Limits()
        argv = grading_kernel.kernel_argv(sys.executable, self.rpc_path)
        self._kernel_spec = KernelSpec(
            argv=join_cgroup_argv(list(self.cgroup_procs))
            + bwrap_command(argv, uid=self.sandbox_uid, ipc_dir=self.kernel_dir, limits=limits),
            display_name="Python 3 (agent-lab grading sandbox)", language="python",
            interrupt_mode="message", env={},
        )

    @property
    def kernel_spec(self) -> KernelSpec:
        return self._kernel_spec

    @property
    def ipykernel(self) -> bool:
        return True

    def write_connection_file(self, **kwargs) -> None:
        super().write_connection_file(**kwargs)
        # The kernel runs as sandbox_uid and must read its key; the directory is private to that uid.
        os.chown(self.connection_file, self.sandbox_uid, self.sandbox_uid)

    def after_ready(self) -> None:
        """The kernel has bound its sockets: take its write access to the (host) socket directory away."""
        os.chown(self.kernel_dir, 0, 0)
        os.chmod(self.kernel_dir, 0o755)
        if os.path.exists(self.connection_file):
            os.chown(self.connection_file, 0, 0)
            os.chmod(self.connection_file, 0o600)

    def processes(self) -> list[int]:
        """Every live process of the sandbox uid: the kernel, and whatever it started (even with ``setsid``)."""
        return processes_of(self.sandbox_uid)

    def after_shutdown(self) -> None:
        """Nothing the kernel started may outlive it (a fork bomb's leftovers, ``setsid`` processes)."""
        reap(self.sandbox_uid)
        shutil.rmtree(self.kernel_dir, ignore_errors=True)


def make_ipc_dir(path: str | os.PathLike, uid: int) -> str:
    """A new directory (mode 0700, owned by ``uid``) in a root-owned parent; short enough for AF_UNIX."""
    path = Path(path)
    root_dir(path.parent)
    if len(str(path)) > 80:
        raise ValueError(f"ipc dir {path} is too long for unix socket paths (needs <= 80 chars)")
    path.mkdir(mode=0o700)  # fails if it exists: never reuse a directory someone else prepared
    os.chown(path, uid, uid)
    return str(path)
