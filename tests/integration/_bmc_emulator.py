"""A real Redfish BMC for the tests: ``sushy-emulator`` with its fake systems driver.

Run as ``python tests/integration/_bmc_emulator.py --port P --state DIR [--auth FILE]``;
:class:`Emulator` starts one per node on 127.0.0.1 and stops it (an unreachable
BMC is a stopped emulator). The emulator is sushy-tools' own Flask application
and fake driver (power state, resets with a hardware delay, basic auth from an
htpasswd file). Two things a real BMC has that the fake driver lacks are added
here as ordinary Redfish resources, served from ``DIR/faults.json``:

* ``/redfish/v1/Systems/<id>/LogServices/SEL/Entries`` (the system event log) and
  the system's ``Status.Health`` / ``HealthRollup``;
* a ``/_fault`` endpoint the test uses to inject faults: ``power`` (a power loss
  sets the fake driver's state directly, as pulling the plug does), ``health``,
  ``sel`` entries, ``hung`` (the host stops answering while powered; any reset
  or power-off clears it, which is what "a power cycle brings it back" means) and
  ``delay`` (seconds a power change takes). ``GET /_host`` also lists ``resets``:
  every reset request the BMC accepted, in order.

``GET /_host`` answers the test's in-band probe: ``{"answering": bool}`` (powered
on and not hung). The fake driver's 1-11 s power-change delay is cut to 1 s so
the tests stay short (the ``delay`` fault sets it); the adapter polls, so it does not
depend on the delay.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
SYSTEM = "node"


def _serve(port: int, state: Path, auth: str | None) -> None:  # pragma: no cover - child
    import flask
    from sushy_tools.emulator import main as emu
    from sushy_tools.emulator.resources.systems import fakedriver

    faults_path = state / "faults.json"

    def faults() -> dict[str, Any]:
        try:
            return dict(json.loads(faults_path.read_text()))
        except (OSError, ValueError):
            return {}

    # The fake driver's power-change delay: 1 s, or the ``delay`` fault (seconds).
    fakedriver.random.randint = lambda a, b: int(faults().get("delay", a))  # type: ignore[attr-defined]

    def save(data: dict[str, Any]) -> None:
        tmp = faults_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, faults_path)

    app = emu.app
    config = {
        "SUSHY_EMULATOR_FAKE_DRIVER": True,
        "SUSHY_EMULATOR_LISTEN_IP": "127.0.0.1",
        # the fake driver's state lives here, not in a directory every emulator shares
        "SUSHY_EMULATOR_STATE_DIR": str(state),
        "SUSHY_EMULATOR_FAKE_SYSTEMS": [
            {
                "uuid": "27946b59-9e44-4fa7-8e91-f3527a1ef094",
                "name": SYSTEM,
                "power_state": "On",
                "nics": [{"mac": "00:5c:52:31:3a:9c", "ip": "127.0.0.1"}],
            }
        ],
    }
    if auth:
        config["SUSHY_EMULATOR_AUTH_FILE"] = auth
    app.configure(extra_config=config)

    def driver() -> Any:
        return app.systems

    def uuid() -> str:
        return str(driver().uuid(SYSTEM))

    @app.route("/redfish/v1/Systems/<identity>/LogServices", methods=["GET"])
    def log_services(identity: str) -> Any:
        base = f"/redfish/v1/Systems/{identity}/LogServices"
        return flask.jsonify(
            {
                "@odata.id": base,
                "Name": "Log Service Collection",
                "Members": [{"@odata.id": f"{base}/SEL"}],
                "Members@odata.count": 1,
            }
        )

    @app.route("/redfish/v1/Systems/<identity>/LogServices/SEL", methods=["GET"])
    def sel(identity: str) -> Any:
        base = f"/redfish/v1/Systems/{identity}/LogServices/SEL"
        return flask.jsonify(
            {"@odata.id": base, "Id": "SEL", "Entries": {"@odata.id": f"{base}/Entries"}}
        )

    @app.route("/redfish/v1/Systems/<identity>/LogServices/SEL/Entries", methods=["GET"])
    def sel_entries(identity: str) -> Any:
        base = f"/redfish/v1/Systems/{identity}/LogServices/SEL/Entries"
        members = [
            {"@odata.id": f"{base}/{i + 1}", "Id": str(i + 1), "EntryType": "SEL", **e}
            for i, e in enumerate(faults().get("sel", []))
        ]
        return flask.jsonify(
            {"@odata.id": base, "Members": members, "Members@odata.count": len(members)}
        )

    @app.after_request
    def add_health(response: Any) -> Any:
        req = flask.request
        body = response.get_json(silent=True) if req.method == "GET" else None
        if isinstance(body, dict) and req.path.rstrip("/") == f"/redfish/v1/Systems/{uuid()}":
            health = faults().get("health", "OK")
            body["Status"] = {"State": "Enabled", "Health": health, "HealthRollup": health}
            body["LogServices"] = {"@odata.id": f"{req.path.rstrip('/')}/LogServices"}
            response.set_data(json.dumps(body))
        if req.method == "POST" and req.path.endswith("ComputerSystem.Reset"):
            data = faults()
            data.pop("hung", None)
            # every reset the BMC accepted, in order: what a test counts ("never twice")
            if response.status_code < 300:
                sent = (req.get_json(silent=True) or {}).get("ResetType")
                data["resets"] = [*data.get("resets", []), sent]
            save(data)
        return response

    @app.route("/_fault", methods=["POST"])
    def inject() -> Any:
        body = flask.request.get_json()
        data = faults()
        if "power" in body:
            system = driver()._get(uuid())
            driver()._update(system, power_state=body["power"], pending_power=None)
        for name in ("health", "hung", "delay"):
            if name in body:
                data[name] = body[name]
        if "sel" in body:
            data["sel"] = [*data.get("sel", []), *body["sel"]]
        save(data)
        return flask.jsonify(data)

    @app.route("/_host", methods=["GET"])
    def host() -> Any:
        on = driver().get_power_state(uuid()) == "On"
        data = faults()
        return flask.jsonify(
            {
                "answering": on and not data.get("hung", False),
                "power": driver().get_power_state(uuid()),
                "resets": data.get("resets", []),
            }
        )

    # The auth middleware wraps every path; the test's own endpoints skip it.
    emu.RedfishAuthMiddleware._EXCLUDE_PATHS = frozenset(
        ["", "redfish", "redfish/v1", "_fault", "_host"]
    )
    app.run(host="127.0.0.1", port=port, threaded=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_htpasswd(path: Path, user: str, password: str) -> Path:
    """An htpasswd file (bcrypt) the emulator checks basic auth against."""
    import bcrypt

    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    path.write_text(f"{user}:{hashed}\n")
    return path


class Emulator:
    """One running sushy-emulator (one node's BMC) on 127.0.0.1."""

    def __init__(self, state: Path, *, auth: Path | None = None, port: int | None = None):
        self.state = state
        self.state.mkdir(parents=True, exist_ok=True)
        self.auth = auth
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Emulator:
        cmd = [sys.executable, str(HERE), "--port", str(self.port), "--state", str(self.state)]
        if self.auth is not None:
            cmd += ["--auth", str(self.auth)]
        log = open(self.state / "emulator.log", "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.host()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        "sushy-emulator exited: " + (self.state / "emulator.log").read_text()
                    ) from None
                time.sleep(0.1)
        raise RuntimeError("sushy-emulator did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def _call(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def fault(self, **body: Any) -> dict[str, Any]:
        return self._call("/_fault", body)

    def host(self) -> dict[str, Any]:
        return self._call("/_host")

    def answering(self) -> bool:
        """The in-band probe: the host answers when powered on and not hung; a stopped
        emulator (the whole server gone) does not answer."""
        try:
            return bool(self.host()["answering"])
        except OSError:
            return False


if __name__ == "__main__":  # pragma: no cover - the child
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--auth")
    args = parser.parse_args()
    _serve(args.port, args.state, args.auth)
