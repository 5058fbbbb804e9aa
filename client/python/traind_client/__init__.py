"""traind_client: a small Python client for traind's gRPC API (proto/traind/v1/job_service.proto).

The generated modules (package ``traind.v1``) must be importable: CMake writes them to
``<build>/python`` (target ``traind_python_proto``), or run ``client/python/gen_proto.sh DIR``;
then put that folder and ``client/python`` on PYTHONPATH. Needs Debian's python3-grpcio and
python3-protobuf, i.e. ``/usr/bin/python3``.

    from traind_client import Client, resolve_token
    c = Client("127.0.0.1:50051", resolve_token(state_dir=".traind"))
    job = c.submit_file("examples/tiny.yaml")
    for ev in c.watch(job.id):
        ...
    print(c.get(job.id).state)   # a JobState enum value; state_name() gives "SUCCEEDED"

Every call sends ``authorization: Bearer <token>`` like trainctl; errors raise TraindError with the
gRPC status code name (UNAUTHENTICATED for a wrong token, NOT_FOUND, INVALID_ARGUMENT, ...).
"""
import os
import time

try:
    import grpc
except ImportError as e:  # the pyenv python on PATH does not see Debian's dist-packages
    raise ImportError("traind_client needs python3-grpcio (Debian): run it with /usr/bin/python3") from e
try:
    from traind.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc
except ImportError as e:
    raise ImportError(
        "traind_client: the generated traind.v1 modules are not on sys.path; build the CMake target "
        "traind_python_proto (writes <build>/python) or run client/python/gen_proto.sh DIR, and add "
        "that folder to PYTHONPATH") from e

__all__ = ["Client", "TraindError", "resolve_token", "state_name", "is_terminal", "job_pb2", "job_service_pb2"]

TERMINAL = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED)


def state_name(state):
    """The CLI contract's name of a JobState: QUEUED RUNNING SUCCEEDED FAILED CANCELLED."""
    name = job_pb2.JobState.Name(state)
    return name[len("JOB_STATE_"):] if name.startswith("JOB_STATE_") else name


def is_terminal(state):
    return state in TERMINAL


class TraindError(Exception):
    """A failed call: ``code`` is the gRPC status code name, ``details`` traind's message."""

    def __init__(self, code, details, method=""):
        self.code = code
        self.details = details
        self.method = method
        hint = ""
        if code == "UNAUTHENTICATED":
            hint = " (traind refused the token: check --token / --token-file / $TRAIND_TOKEN)"
        elif code == "UNAVAILABLE":
            hint = " (is traind running at that address?)"
        super().__init__(f"{method + ': ' if method else ''}{code}: {details}{hint}")


def resolve_token(token=None, token_file=None, state_dir=None):
    """trainctl's order: token, token_file, $TRAIND_TOKEN, <state_dir>/token."""
    if token:
        return token.strip()
    if token_file:
        with open(token_file) as f:
            return f.read().strip()
    if os.environ.get("TRAIND_TOKEN"):
        return os.environ["TRAIND_TOKEN"].strip()
    if state_dir:
        path = os.path.join(state_dir, "token")
        if os.path.exists(path):
            with open(path) as f:
                return f.read().strip()
    raise TraindError("UNAUTHENTICATED", "no token: pass --token, --token-file, $TRAIND_TOKEN or --state-dir")


class Client:
    """JobService with bearer-token metadata. ``tls=True`` uses the system roots or ``ca_file``."""

    def __init__(self, addr, token, tls=False, ca_file=None, timeout=30.0):
        if tls:
            roots = open(ca_file, "rb").read() if ca_file else None
            self._channel = grpc.secure_channel(addr, grpc.ssl_channel_credentials(root_certificates=roots))
        else:
            self._channel = grpc.insecure_channel(addr)
        self._stub = job_service_pb2_grpc.JobServiceStub(self._channel)
        self._md = (("authorization", "Bearer " + token),)
        self.timeout = timeout

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request):
        try:
            return getattr(self._stub, method)(request, metadata=self._md, timeout=self.timeout)
        except grpc.RpcError as e:
            raise TraindError(e.code().name, e.details(), method) from None

    def submit_yaml(self, text, base_dir="", priority=0):
        """Submits a spec given as YAML/JSON text; relative paths resolve against base_dir."""
        if isinstance(text, str):
            text = text.encode()
        req = job_service_pb2.SubmitJobRequest(spec_yaml=text, base_dir=base_dir, priority=priority)
        return self._call("SubmitJob", req).job

    def submit_file(self, path, priority=0):
        """Submits a spec file; its relative paths resolve against the file's folder."""
        path = os.path.abspath(path)
        with open(path, "rb") as f:
            return self.submit_yaml(f.read(), base_dir=os.path.dirname(path), priority=priority)

    def get(self, job_id):
        return self._call("GetJob", job_service_pb2.GetJobRequest(id=job_id))

    def list(self, limit=0):
        return list(self._call("ListJobs", job_service_pb2.ListJobsRequest(limit=limit)).jobs)

    def cancel(self, job_id):
        return self._call("CancelJob", job_service_pb2.CancelJobRequest(id=job_id))

    def watch(self, job_id, from_sequence=1, follow=True, reconnect_seconds=60.0):
        """Yields the job's JobEvents from from_sequence; with follow, until the job ends. When the
        stream breaks (traind restarting), reconnects for up to reconnect_seconds and resumes after
        the last event seen."""
        next_seq = max(1, from_sequence)
        deadline = None
        while True:
            try:
                req = job_service_pb2.WatchJobRequest(id=job_id, from_sequence=next_seq, follow=follow)
                for ev in self._stub.WatchJob(req, metadata=self._md):
                    deadline = None
                    next_seq = ev.sequence + 1
                    yield ev
                return
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise TraindError(e.code().name, e.details(), "WatchJob") from None
                if deadline is None:
                    deadline = time.monotonic() + reconnect_seconds
                if time.monotonic() > deadline:
                    raise TraindError(e.code().name, e.details(), "WatchJob") from None
                time.sleep(0.5)
