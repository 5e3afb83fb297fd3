#!/usr/bin/env python3
"""End-to-end tests of lemon-desktop on a virtual display.

Run inside `dbus-run-session` (scripts/desktop-e2e does), so the app's session
bus and everything GTK starts on it end with the run.

0. Headless: without DISPLAY or WAYLAND_DISPLAY the app exits 2 with a
   message pointing to `lemon-gateway serve`, and starts nothing.
1. Tray: Xvfb + trayer (an XEmbed tray host). The menu is opened with xdotool
   and screenshotted; Pause intake and Resume are chosen from it and checked
   through /v1/status; the icon turns busy with a running run; a slow run is
   started and Quit is chosen: the app exits 0 after the run completed (read
   from its record in the database), and no process of that home is left in
   /proc. The menu is opened only once the app's log says the tray shows the
   expected state (a rebuilt menu closes an open one).
2. Instance: Xvfb + trayer + fake notification server and file manager on the
   session bus (fake_desktop_bus.py). A run that finishes while the window is
   hidden is announced (a Notify call with the run's summary); a second
   launch on the same home exits 0 at once and the first one's window is
   mapped and has the input focus (xdotool); a run that finishes while the
   window is shown is not announced. From the menu: Start at login writes the
   XDG autostart entry and removes it again, Reveal config folder calls
   FileManager1.ShowItems on config.toml, Show logs runs xdg-open (a fake on
   PATH) on logs/desktop.log, and Quit ends the app.
3. No tray host, window and live view: Xvfb alone. The app opens its window on
   the dashboard with the warning, driven through tauri-driver +
   WebKitWebDriver over plain W3C WebDriver HTTP: the dashboard is signed in by
   the per-launch token without typing it, and a run started through the API
   streams into the live view. The window is screenshotted.

4. Approval: Xvfb + trayer + the fake notification server, the native engine
   on a fake model (fake_llm.py) whose `bash` call waits for an answer: it
   is a notification with Approve / Deny / Always buttons, and pressing
   Approve (org.lemon.E2E.Press) runs the command; a second call is offered
   in the tray menu ("· 1 call waiting for you"), Deny there keeps it from
   running, the model is told, and its notification is closed.

LEMON_DESKTOP_E2E_ONLY=headless|tray|instance|approval|window runs one step.

Usage: desktop_e2e.py <lemon-desktop binary> <artifacts dir>
"""

import base64
import http.client
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

TOKEN = "desktop-e2e-token-0123456789"
PATIENCE = 60.0
# Twelve words at 250 ms: a run that is still going while the menu is used.
SLOW_PROMPT = "alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima"

children = []


def log(message):
    print(f"desktop-e2e: {message}", flush=True)


def fail(message):
    raise SystemExit(f"desktop-e2e: FAILED: {message}")


def until(what, check, patience=PATIENCE, every=0.05):
    """Polls `check` until it returns a true value; fails after `patience` seconds."""
    deadline = time.monotonic() + patience
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            fail(f"timed out waiting for {what}")
        time.sleep(every)


def spawn(args, env=None, **kwargs):
    proc = subprocess.Popen(args, env=env, **kwargs)
    children.append(proc)
    return proc


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def start_display():
    """Xvfb on a free display number; the number."""
    read, write = os.pipe()
    proc = spawn(["Xvfb", "-displayfd", str(write), "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                 pass_fds=(write,), stderr=subprocess.DEVNULL)
    os.close(write)
    with os.fdopen(read) as pipe:
        number = pipe.readline().strip()
    if not number:
        fail("Xvfb did not start")
    return proc, f":{number}"


def start_tray_host(display):
    """trayer, an XEmbed tray host, at the bottom right of `display`."""
    return spawn(["trayer", "--edge", "bottom", "--align", "right", "--widthtype", "pixel", "--width", "200",
                  "--heighttype", "pixel", "--height", "40", "--transparent", "false"],
                 env={**os.environ, "DISPLAY": display}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_desktop_bus():
    """The fake notification server and file manager (fake_desktop_bus.py) on
    this run's session bus, once they own their names; the process and a
    function listing its calls of one name (Notify, CloseNotification…)."""
    here = os.path.dirname(os.path.abspath(__file__))
    server = spawn([system_python(), os.path.join(here, "fake_desktop_bus.py")],
                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    calls = Log(server.stdout)
    until("the notification server and file manager to own their names", lambda: calls.find(r"^ready$"))

    def bus_calls(name):
        return [c for c in (json.loads(line) for line in list(calls.lines) if line.startswith("{"))
                if c["call"] == name]
    return server, bus_calls


def home_with(config):
    home = tempfile.mkdtemp(prefix="lemon-desktop-e2e-")
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write(config + "\n[gateway.api]\nport = 0\n\n[gateway.health]\nport = 0\n")
    return home


def app_env(home, display):
    env = {k: v for k, v in os.environ.items() if k not in ("WAYLAND_DISPLAY", "LEMON_API_TOKEN")}
    env.update({
        "DISPLAY": display,
        "HOME": home,
        "LEMON_HOME": home,
        "LEMON_API_TOKEN": TOKEN,
        "LEMON_KEYCHAIN": "off",
        "NO_AT_BRIDGE": "1",
        # The app's debug lines say what the tray shows and whether a finished
        # run was announced: the tests wait for them.
        "RUST_LOG": "info,lemon_desktop=debug",
        "XDG_CONFIG_HOME": os.path.join(home, ".config"),
    })
    return env


class Log:
    """A child's stderr, read line by line in the background into a list."""

    def __init__(self, stream):
        import threading
        self.lines = []
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for raw in stream:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def find(self, pattern):
        for line in self.lines:
            match = re.search(pattern, line)
            if match:
                return match
        return None

    def text(self):
        return "\n".join(self.lines)

    def last(self, pattern):
        """The last line matching `pattern`, as a match, or None."""
        for line in reversed(list(self.lines)):
            match = re.search(pattern, plain(line))
            if match:
                return match
        return None


def drawn(output):
    """(status line, icon, start at login) the tray shows now, from the app's
    last `tray drawn` line."""
    match = output.last(r"tray drawn status=(.*) icon=(\S+) autostart=(true|false)\s*$")
    return (match.group(1), match.group(2), match.group(3) == "true") if match else None


def wait_drawn(output, status, icon, autostart=False):
    """Waits until the tray shows `status` with `icon` (and Start at login
    checked or not). A menu is opened only after this: the app rebuilds the
    menu when what it shows changes, and a rebuilt menu closes the one that
    is open."""
    until(f"the tray to show {status!r} ({icon}, start at login {autostart})",
          lambda: drawn(output) == (status, icon, autostart))


def plain(line):
    return re.sub(r"\x1b\[[0-9;]*m", "", line)


def api(base, method, path, body=None, token=TOKEN):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def xdotool(display, *args):
    return subprocess.run(["xdotool", *args], env={**os.environ, "DISPLAY": display},
                          capture_output=True, text=True, timeout=20)


def screenshot(display, path):
    subprocess.run(["import", "-window", "root", path], env={**os.environ, "DISPLAY": display},
                   check=True, timeout=30)
    log(f"screenshot {path}")


def processes_of(home):
    """PIDs whose environment names `home` as LEMON_HOME."""
    needle = f"LEMON_HOME={home}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


def run_record(home, run_id):
    db = sqlite3.connect(f"file:{os.path.join(home, 'lemon.db')}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT status, answer FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    finally:
        db.close()
    return row


def start_app(binary, home, display, env=None):
    env = env or app_env(home, display)
    proc = spawn([binary], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    output = Log(proc.stderr)
    ready = until("the app to be ready", lambda: proc.poll() is not None or output.find(r"desktop ready"))
    if proc.poll() is not None:
        fail(f"the app exited with {proc.returncode}:\n{output.text()}")
    line = plain(ready.string)
    dashboard = re.search(r'dashboard="?(http://127\.0\.0\.1:\d+)', line)
    if not dashboard:
        fail(f"no dashboard address in: {line}")
    return proc, output, dashboard.group(1), line


class Menu:
    """The tray menu, driven with the keyboard as a person would."""

    def __init__(self, display):
        self.display = display
        # Windows of the app shown before the menu opens (the main window).
        self.baseline = 0

    def icon(self):
        # The mapped icon window: the tray host embeds a new one when the
        # icon is redrawn, and an old one may still be listed, unmapped.
        found = xdotool(self.display, "search", "--onlyvisible", "--class", "tray-icon").stdout.split()
        return found[-1] if found else None

    def open(self):
        self.baseline = self.popups()
        # A right-click that lands while the tray host swaps the icon's
        # window opens nothing; clicking again then is safe (no menu is
        # open to close), so the click is repeated, a bounded number of times.
        for attempt in range(3):
            wid = until("the tray icon", self.icon)
            geometry = dict(
                line.split("=", 1) for line in xdotool(self.display, "getwindowgeometry", "--shell", wid).stdout.split()
            )
            x = int(geometry["X"]) + int(geometry["WIDTH"]) // 2
            y = int(geometry["Y"]) + int(geometry["HEIGHT"]) // 2
            xdotool(self.display, "mousemove", str(x), str(y), "click", "3")
            # The menu is a popup window of the app; wait until it is mapped.
            deadline = time.monotonic() + PATIENCE / 6
            while time.monotonic() < deadline and self.popups() <= self.baseline:
                time.sleep(0.05)
            if self.popups() > self.baseline:
                break
            log(f"tray: no menu after a right-click on icon {wid} at {x},{y} (attempt {attempt + 1})")
        else:
            icons = xdotool(self.display, "search", "--class", "tray-icon").stdout.split()
            fail(f"the menu did not open; tray-icon windows: {icons}")
        # Away from the menu, so the pointer selects nothing and the keys count from the end.
        xdotool(self.display, "mousemove", "5", "5")
        return x, y

    def popup_geometry(self):
        """(x, y, width, height) of the open menu."""
        wid = xdotool(self.display, "search", "--onlyvisible", "--class", "lemon-desktop").stdout.split()[-1]
        geometry = dict(
            line.split("=", 1) for line in xdotool(self.display, "getwindowgeometry", "--shell", wid).stdout.split()
        )
        return int(geometry["X"]), int(geometry["Y"]), int(geometry["WIDTH"]), int(geometry["HEIGHT"])

    def popups(self):
        out = xdotool(self.display, "search", "--onlyvisible", "--class", "lemon-desktop").stdout.split()
        return len(out)

    def choose(self, label_index_from_bottom):
        """Selects the item `n` places up from the bottom (Quit is 1) and activates it."""
        xdotool(self.display, "key", *(["Up"] * label_index_from_bottom), "Return")

    def choose_from_top(self, n):
        """Selects the `n`th item that can be chosen from the top (the status
        line cannot) and activates it."""
        xdotool(self.display, "key", *(["Down"] * n), "Return")

    def closed(self):
        return self.popups() <= self.baseline


def tray_test(binary, artifacts):
    log("tray: Xvfb + trayer, pause, resume, quit with a run draining")
    xvfb, display = start_display()
    trayer = start_tray_host(display)
    home = home_with("[gateway.engines.echo]\ndelay_ms = 250\n")
    try:
        proc, output, base, ready = start_app(binary, home, display)
        if "tray=true" not in ready:
            fail(f"the tray was not created: {ready}\n{output.text()}")
        if "window=false" not in ready:
            fail(f"with a tray the window should start hidden: {ready}")
        menu = Menu(display)
        # Items from the bottom: Quit 1, Start at login 2, Restart 3, Show logs 4,
        # Reveal 5, Copy token 6, Pause/Resume 7, Open dashboard 8.
        wait_drawn(output, "Lemon Gateway: idle", "Idle")
        menu.open()
        time.sleep(0.5)  # let the menu paint before the screenshot (a picture, not a wait for state)
        screenshot(display, os.path.join(artifacts, "tray-menu.png"))
        menu.choose(7)
        until("intake paused in /v1/status", lambda: api(base, "GET", "/v1/status")[1].get("paused") is True)
        log("tray: Pause intake → /v1/status paused")
        # While paused a message is accepted and waits.
        status, body = api(base, "POST", "/v1/runs", {"prompt": SLOW_PROMPT, "run_id": "tray-slow-1"})
        if status != 202:
            fail(f"submit while paused: {status} {body}")
        time.sleep(0.3)
        if api(base, "GET", "/v1/runs/tray-slow-1")[1]["status"] != "queued":
            fail("a run started while intake was paused")
        until("the menu to close", menu.closed)
        # The queued run and the paused intake are in the menu before it opens.
        wait_drawn(output, "Lemon Gateway: idle, 1 queued · intake paused", "Idle")
        menu.open()
        screenshot(display, os.path.join(artifacts, "tray-menu-paused.png"))
        menu.choose(7)
        until("intake resumed in /v1/status", lambda: api(base, "GET", "/v1/status")[1].get("paused") is False)
        log("tray: Resume intake → /v1/status not paused")
        until("the run to start", lambda: api(base, "GET", "/v1/runs/tray-slow-1")[1]["status"] == "running")
        until("the menu to close", menu.closed)
        # The icon turns busy with the run; the menu lists it, and Quit is
        # still the last item.
        wait_drawn(output, "Lemon Gateway: 1 run active", "Busy(1)")
        log("tray: the icon is busy with the running run")
        menu.open()
        busy = os.path.join(artifacts, "tray-menu-busy.png")
        screenshot(display, busy)
        # The menu and the tray below it, for the README.
        x, y, width, height = menu.popup_geometry()
        left, top = max(x - 16, 0), max(y - 16, 0)
        crop = f"{width + 32}x{min(height + 72, 800 - top)}+{left}+{top}"
        subprocess.run(["convert", busy, "-crop", crop, "+repage", os.path.join(artifacts, "tray.png")],
                       check=True, timeout=30)
        menu.choose(1)
        until("the app to exit", lambda: proc.poll() is not None, patience=PATIENCE)
        if proc.returncode != 0:
            fail(f"the app exited with {proc.returncode}:\n{output.text()}")
        status, answer = run_record(home, "tray-slow-1")
        if status != "completed" or answer != SLOW_PROMPT:
            fail(f"the run was not drained: {status} {answer!r}")
        log("tray: Quit → exit 0, the running run completed before the gateway stopped")
        # The WebKit helper processes end with their socket: a bounded wait.
        until("no process of the app left", lambda: not processes_of(home), patience=20)
    finally:
        for child in (trayer, xvfb):
            stop(child)
        shutil.rmtree(home, ignore_errors=True)


def approval_test(binary, artifacts):
    log("approval: a call waiting for an answer is a notification with buttons and two tray items")
    xvfb, display = start_display()
    trayer = start_tray_host(display)
    server, bus_calls = start_desktop_bus()
    here = os.path.dirname(os.path.abspath(__file__))
    llm = spawn([sys.executable, os.path.join(here, "fake_llm.py")], stdout=subprocess.PIPE)
    port = llm.stdout.readline().decode().strip()
    if not port.isdigit():
        fail(f"the fake model did not start: {port!r}")

    home = home_with("")
    # Outside the gateway's home, which no run may work in.
    work = tempfile.mkdtemp(prefix="lemon-desktop-e2e-work-")
    with open(os.path.join(home, "config.toml"), "a") as f:
        f.write(f'\n[gateway]\ndefault_engine = "lemon"\n'
                f'\n[gateway.engines.lemon]\nbase_url = "http://127.0.0.1:{port}/v1"\nmodel = "e2e-model"\n')
    secrets = os.path.join(home, "secrets.toml")
    with open(secrets, "w") as f:
        f.write('openai_api_key = "sk-desktop-e2e"\n')
    os.chmod(secrets, 0o600)
    try:
        proc, output, base, ready = start_app(binary, home, display)
        # A button of the notification approves.
        status, body = api(base, "POST", "/v1/runs", {"prompt": "COMMAND <touch notified.txt>", "run_id": "ask-1", "cwd": work})
        if status != 202:
            fail(f"submit: {status} {body}")
        asked = until("a notification asking about the call", lambda: next(
            (c for c in bus_calls("Notify") if c["summary"] == "Allow this?"), None))
        if not asked["body"].startswith("bash: touch notified.txt"):
            fail(f"the notification says {asked['body']!r}")
        expected = ["approve", "Approve", "deny", "Deny", "always", "Always for this session"]
        if asked["actions"] != expected:
            fail(f"the notification's buttons are {asked['actions']}, not {expected}")
        if os.path.exists(os.path.join(work, "notified.txt")):
            fail("the command ran before the answer")
        subprocess.run(["dbus-send", "--session", "--type=method_call", "--dest=org.freedesktop.Notifications",
                        "/org/freedesktop/Notifications", "org.lemon.E2E.Press",
                        f"uint32:{asked['id']}", "string:approve"], check=True, timeout=20)
        until("the run to complete", lambda: api(base, "GET", "/v1/runs/ask-1")[1]["status"] == "completed")
        if not os.path.exists(os.path.join(work, "notified.txt")):
            fail(f"the approved command did not run: {api(base, 'GET', '/v1/runs/ask-1')[1]}\n{output.text()[-3000:]}")
        until("the first notification to close",
              lambda: any(c["id"] == asked["id"] for c in bus_calls("CloseNotification")))
        log("approval: the notification's Approve button ran the command")

        # The tray offers Approve and Deny; Deny keeps the command from running.
        status, body = api(base, "POST", "/v1/runs", {"prompt": "COMMAND <touch from-tray.txt>", "run_id": "ask-2", "cwd": work})
        if status != 202:
            fail(f"submit: {status} {body}")
        second = until("the second notification", lambda: next(
            (c for c in bus_calls("Notify") if c["body"].startswith("bash: touch from-tray.txt")), None)
            or (api(base, "GET", "/v1/runs/ask-2")[1]["status"] == "completed"
                and fail(f"the second run ended unasked: {api(base, 'GET', '/v1/runs/ask-2')[1]}\n{bus_calls('Notify')}")))
        wait_drawn(output, "Lemon Gateway: 1 run active · 1 call waiting for you", "Busy(1)")
        menu = Menu(display)
        menu.open()
        time.sleep(0.5)  # let the menu paint before the screenshot (a picture, not a wait for state)
        screenshot(display, os.path.join(artifacts, "tray-approval.png"))
        menu.choose_from_top(2)
        until("the run to complete", lambda: api(base, "GET", "/v1/runs/ask-2")[1]["status"] == "completed")
        if os.path.exists(os.path.join(work, "from-tray.txt")):
            fail("the denied command ran")
        answer = api(base, "GET", "/v1/runs/ask-2")[1]["answer"]
        if "The owner denied this call (api via desktop)" not in answer:
            fail(f"the model was not told of the denial: {answer!r}")
        until("the second notification to close",
              lambda: any(c["id"] == second["id"] for c in bus_calls("CloseNotification")))
        log("approval: Deny from the tray kept the command from running and closed its notification")
        until("the menu to close", menu.closed)
        wait_drawn(output, "Lemon Gateway: idle", "Idle")
        menu.open()
        menu.choose(1)
        until("the app to exit", lambda: proc.poll() is not None, patience=PATIENCE)
    finally:
        for child in (llm, server, trayer, xvfb):
            stop(child)
        until("the app's processes to end", lambda: not processes_of(home), patience=20)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def headless_test(binary):
    log("headless: no display → a clear message, exit 2, nothing started")
    home = home_with("")
    try:
        env = app_env(home, "")
        for name in ("DISPLAY", "WAYLAND_DISPLAY"):
            env.pop(name, None)
        result = subprocess.run([binary], env=env, capture_output=True, timeout=PATIENCE)
        message = result.stderr.decode(errors="replace")
        if result.returncode != 2 or "no display" not in message or "lemon-gateway serve" not in message:
            fail(f"without a display: exit {result.returncode}, {message!r}")
        if os.path.exists(os.path.join(home, "lemon.db")):
            fail("a gateway was started without a display")
        log(f"headless: {message.strip()}")
    finally:
        shutil.rmtree(home, ignore_errors=True)


def system_python():
    """A Python with Debian's python3-dbus and python3-gi, for the fake
    notification server: the one on PATH when it has them, else /usr/bin/python3."""
    for candidate in (shutil.which("python3"), "/usr/bin/python3"):
        if candidate and subprocess.run([candidate, "-c", "import dbus, gi"],
                                        capture_output=True, timeout=30).returncode == 0:
            return candidate
    fail("no Python with the dbus and gi modules (apt-get install python3-dbus python3-gi)")


def window_of(display):
    """The app's main window when it is mapped, else None."""
    found = xdotool(display, "search", "--onlyvisible", "--name", "^Lemon Gateway$").stdout.split()
    return found[0] if found else None


def instance_test(binary, artifacts):
    log("instance: a run that ends while the window is hidden is announced; a second launch shows the window")
    xvfb, display = start_display()
    trayer = start_tray_host(display)
    # The desktop's notification server, on this run's session bus.
    server, bus_calls = start_desktop_bus()

    def notified():
        return bus_calls("Notify")

    home = home_with("[gateway.engines.echo]\ndelay_ms = 20\n")
    # "Show logs" opens the log with the desktop's default program: a fake
    # xdg-open, first on PATH, writes down what it was asked to open.
    bin_dir = os.path.join(home, "bin")
    opened = os.path.join(home, "xdg-open.txt")
    os.makedirs(bin_dir)
    with open(os.path.join(bin_dir, "xdg-open"), "w") as f:
        f.write(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{opened}"\n')
    os.chmod(os.path.join(bin_dir, "xdg-open"), 0o755)
    env = app_env(home, display)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    autostart_dir = os.path.join(home, ".config", "autostart")

    def autostart_entries():
        return os.listdir(autostart_dir) if os.path.isdir(autostart_dir) else []

    output = None
    try:
        proc, output, base, ready = start_app(binary, home, display, env)
        if "tray=true" not in ready or "window=false" not in ready:
            fail(f"with a tray the window should start hidden: {ready}")
        if window_of(display):
            fail("the window is shown at start")
        # Hidden window: the finished run is announced.
        prompt = "hidden window answer"
        status, body = api(base, "POST", "/v1/runs", {"prompt": prompt, "run_id": "hidden-1"})
        if status != 202:
            fail(f"submit: {status} {body}")
        call = until("a Notify call for the run", lambda: next(
            (c for c in notified() if c["body"] == prompt), None))
        run = api(base, "GET", "/v1/runs/hidden-1")[1]
        expected = f"Run completed in {run['session_key']}"
        if call["summary"] != expected:
            fail(f"the notification says {call['summary']!r}, not {expected!r}")
        log(f"instance: hidden window → Notify {call['summary']!r}: {call['body']!r}")

        # A second launch on the same home ends at once and shows the first one's window.
        started = time.monotonic()
        second = subprocess.run([binary], env=env, capture_output=True, timeout=PATIENCE)
        took = time.monotonic() - started
        if second.returncode != 0:
            fail(f"the second launch exited with {second.returncode}: {second.stderr.decode(errors='replace')}")
        if "desktop ready" in second.stderr.decode(errors="replace"):
            fail("the second launch started an app of its own")
        until("the first app to hear of the second launch", lambda: output.find(r"a second launch: showing the window"))
        wid = until("the window to be shown", lambda: window_of(display))
        until("the window to have the focus", lambda: xdotool(display, "getwindowfocus").stdout.strip() == wid)
        log(f"instance: the second launch exited 0 in {took:.1f} s; the first one's window {wid} is mapped and focused")

        # Shown window: no notification.
        status, body = api(base, "POST", "/v1/runs", {"prompt": "shown window answer", "run_id": "shown-1"})
        if status != 202:
            fail(f"submit: {status} {body}")
        until("the app to see the run finish", lambda: output.last(r'run finished run_id="?shown-1"? notified=false'))
        # The page paints a moment after the window is mapped: the picture is
        # taken once the window is no longer one flat colour.
        shot = os.path.join(artifacts, "second-launch.png")

        def painted():
            subprocess.run(["import", "-window", wid, shot], env={**os.environ, "DISPLAY": display},
                           check=True, timeout=30)
            spread = subprocess.run(["convert", shot, "-format", "%[fx:standard_deviation]", "info:"],
                                    capture_output=True, text=True, timeout=30).stdout.strip()
            return float(spread or 0) > 0.01
        until("the window to be painted", painted, every=0.2)
        log(f"screenshot {shot}")

        # Start at login, from the menu: the XDG autostart entry is written,
        # the item is checked, and the second time the entry is gone.
        wait_drawn(output, "Lemon Gateway: idle", "Idle")
        if autostart_entries():
            fail(f"an autostart entry before Start at login: {autostart_entries()}")
        menu = Menu(display)
        menu.open()
        menu.choose(2)
        until("the autostart entry", autostart_entries)
        entry = os.path.join(autostart_dir, autostart_entries()[0])
        with open(entry) as f:
            text = f.read()
        if "[Desktop Entry]" not in text or "Exec=" not in text:
            fail(f"the autostart entry is no desktop entry: {text!r}")
        wait_drawn(output, "Lemon Gateway: idle", "Idle", autostart=True)
        until("the menu to close", menu.closed)
        menu.open()
        menu.choose(2)
        until("the autostart entry to be removed", lambda: not autostart_entries())
        wait_drawn(output, "Lemon Gateway: idle", "Idle", autostart=False)
        log(f"instance: Start at login wrote {os.path.basename(entry)} into ~/.config/autostart and removed it")
        # Reveal config folder asks the file manager to show config.toml.
        until("the menu to close", menu.closed)
        menu.open()
        menu.choose(5)
        config_uri = "file://" + os.path.join(home, "config.toml")
        until("ShowItems for config.toml", lambda: any(c["uris"] == [config_uri] for c in bus_calls("ShowItems")))
        log("instance: Reveal config folder → FileManager1.ShowItems config.toml")
        # Show logs opens the app's log.
        until("the menu to close", menu.closed)
        menu.open()
        menu.choose(4)
        log_file = os.path.join(home, "logs", "desktop.log")
        until("xdg-open on the log", lambda: os.path.exists(opened) and log_file in open(opened).read())
        log("instance: Show logs → xdg-open logs/desktop.log")
        until("the menu to close", menu.closed)
        menu.open()
        menu.choose(1)
        until("the app to exit", lambda: proc.poll() is not None)
        if proc.returncode != 0:
            fail(f"the app exited with {proc.returncode}:\n{output.text()}")
        if [c for c in notified() if c["body"] != prompt]:
            fail(f"a notification while the window was shown: {notified()}")
        log("instance: shown window → no notification")
        until("no process of the app left", lambda: not processes_of(home), patience=20)
    except BaseException:
        if output is not None:
            sys.stderr.write("the app said:\n" + output.text() + "\n")
        raise
    finally:
        for child in (server, trayer, xvfb):
            stop(child)
        shutil.rmtree(home, ignore_errors=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def webdriver_call(port, method, path, body=None):
    """One W3C WebDriver command to tauri-driver: (HTTP status, JSON answer).

    Spoken as plain HTTP/1.1, with no `Connection: close` (which urllib always
    sends). tauri-driver forwards a command's headers as they are to
    WebKitWebDriver over a pooled keep-alive connection; asked to close,
    WebKitWebDriver closes that connection after answering without saying so
    in its answer, tauri-driver puts it back in its pool, and the next command
    sent on it before the close is noticed is reset, and tauri-driver drops
    the command unanswered (http.client.RemoteDisconnected here)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = None if body is None else json.dumps(body)
        headers = {} if data is None else {"Content-Type": "application/json"}
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def webdriver(port, method, path, body=None):
    status, answer = webdriver_call(port, method, path, body)
    if status != 200:
        fail(f"WebDriver {method} {path}: {status} {json.dumps(answer)[:500]}")
    return answer["value"]


def window_test(binary, artifacts, driver):
    log("window: no tray host, tauri-driver + WebKitWebDriver, sign-in and live view")
    xvfb, display = start_display()
    home = home_with("[gateway.engines.echo]\ndelay_ms = 300\n")
    port, native = free_port(), free_port()
    env = app_env(home, display)
    env["PATH"] = os.path.dirname(driver) + os.pathsep + env.get("PATH", "")
    tauri_driver = spawn([driver, "--port", str(port), "--native-port", str(native)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    driver_log = Log(tauri_driver.stdout)
    session = None
    failed = False
    try:
        # tauri-driver listens at once but starts WebKitWebDriver behind it:
        # until that one listens too, every request tauri-driver forwards
        # fails and the connection is closed without an answer. The W3C
        # status command, forwarded, says when the pair is ready.
        def driver_ready():
            try:
                status, answer = webdriver_call(port, "GET", "/status")
            except (OSError, http.client.HTTPException, ValueError):
                return False
            return status == 200 and answer["value"].get("ready") is True
        until("tauri-driver and WebKitWebDriver to be ready", driver_ready)
        caps = {"capabilities": {"alwaysMatch": {"tauri:options": {"application": os.path.abspath(binary)}}}}
        session = webdriver(port, "POST", "/session", caps)["sessionId"]

        def script(source):
            return webdriver(port, "POST", f"/session/{session}/execute/sync", {"script": source, "args": []})

        # The window is on the dashboard and signed in: the shell shows, the
        # login form does not, and nobody typed the token.
        until("the dashboard signed in", lambda: script(
            "var s = document.getElementById('shell'); return !!s && !s.hidden "
            "&& document.getElementById('login').hidden;"))
        base = script("return window.location.origin;")
        log(f"window: dashboard at {base} signed in by itself")
        if script("return document.getElementById('login-token').value;"):
            fail("the login field holds a value")
        # The token is the launch's own, not the configured one.
        stored = script("return window.sessionStorage.getItem('lemon.token');")
        if not stored or stored == TOKEN:
            fail("the window did not get the per-launch token")
        if api(base, "GET", "/v1/status", token=stored)[0] != 200:
            fail("the per-launch token is refused by the API")
        warning = until("the no-tray warning", lambda: script(
            "var w = document.getElementById('desktop-warning'); return w && w.textContent;"))
        if "No tray is available" not in warning:
            fail(f"the warning does not say why: {warning!r}")
        log("window: the no-tray-host warning is shown")
        # A run started through the API streams into the live view.
        status, body = api(base, "POST", "/v1/runs", {"prompt": SLOW_PROMPT, "run_id": "window-1"})
        if status != 202:
            fail(f"submit: {status} {body}")
        answer_js = ("var a = document.querySelector('article[data-run-id=\"window-1\"] pre.answer'); "
                     "return a ? a.textContent : '';")
        # Part of the answer shows while the run goes on: it streams.
        partial = until("part of the answer in the live view",
                        lambda: (lambda t: t if t.strip() and t.strip() != SLOW_PROMPT else None)(script(answer_js)))
        log(f"window: live view shows {partial.strip()!r} while the run goes on")
        until("the whole answer in the live view", lambda: script(answer_js).strip() == SLOW_PROMPT)
        log("window: the run streamed into the live view")
        png = webdriver(port, "GET", f"/session/{session}/screenshot")
        with open(os.path.join(artifacts, "window.png"), "wb") as f:
            f.write(base64.b64decode(png))
        log(f"screenshot {os.path.join(artifacts, 'window.png')}")
        webdriver(port, "DELETE", f"/session/{session}")
        session = None
    except BaseException:
        failed = True
        raise
    finally:
        stop(tauri_driver)
        if failed:
            driver_log.thread.join(10)
            sys.stderr.write("tauri-driver and the app said:\n" + driver_log.text() + "\n")
        stop(xvfb)
        until("the app's processes to end", lambda: not processes_of(home), patience=20)
        shutil.rmtree(home, ignore_errors=True)


def main():
    binary, artifacts = sys.argv[1], sys.argv[2]
    driver = sys.argv[3] if len(sys.argv) > 3 else shutil.which("tauri-driver")
    os.makedirs(artifacts, exist_ok=True)
    try:
        only = os.environ.get("LEMON_DESKTOP_E2E_ONLY", "")
        if only in ("", "headless"):
            headless_test(binary)
        if only in ("", "tray"):
            tray_test(binary, artifacts)
        if only in ("", "instance"):
            instance_test(binary, artifacts)
        if only in ("", "approval"):
            approval_test(binary, artifacts)
        if only in ("headless", "tray", "instance", "approval"):
            pass
        elif driver:
            window_test(binary, artifacts, driver)
        else:
            fail("tauri-driver not found")
    finally:
        for child in children:
            stop(child)
    log("all passed")


if __name__ == "__main__":
    main()
