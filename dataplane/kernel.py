# sandgate's Python kernel driver (dataplane/kernel.go runs it as
# `python3 -u -c <this script>`; nothing of it is written to a file).
#
# The protocol channel is a private copy of the process's stdin and stdout,
# made at start on high, close-on-exec descriptors; fds 0, 1 and 2 are then
# pointed elsewhere, so user code (and the processes it starts) never reads
# or writes the channel by accident:
#   - fd 0 is /dev/null: input() gets EOF;
#   - during a cell, fds 1 and 2 are fresh pipes (inherited by
#     subprocesses), read by a pump thread that forwards every byte as
#     output frames; between cells they are /dev/null.
#
# Requests (gateway -> kernel, on the private stdin): a 4-byte big-endian
# length, then that many bytes of JSON:
#   {"op": "run", "id": N, "code": "...", "maxBytes": M, "display": D,
#    "env": {...}, "baseEnv": {...}}
#                                  env: os.environ for this cell only (put
#                                  back after it); baseEnv: set once, at
#                                  the first cell that has it
#                                  mark: optional, 1-64 ASCII letters and
#                                  digits: the cell first sends the frame
#                                  J {"op":"mark","mark":"<mark>"}, these
#                                  exact bytes, so that a gateway that
#                                  took the kernel back, its channel cut
#                                  anywhere (a pause let go of it during
#                                  a cell), finds a frame boundary again
#   {"op": "interrupt", "id": N}   SIGINT to this process's main thread
#                                  if cell N is still running
# Frames (kernel -> gateway, on the private stdout): one kind byte, a
# 4-byte big-endian length, then the payload:
#   b"O" / b"E"  raw bytes the cell wrote to fd 1 / fd 2
#   b"R"         the cell's result (the repr of its last expression), UTF-8,
#                at most maxBytes
#   b"D"         when the run asked for display: JSON {"data": {mime: value},
#                "main": bool}, a rich output (display hooks, below): the
#                MIME bundle of the last expression's value (main, before
#                its R frame), of each display(obj), and a PNG of each
#                matplotlib figure, at plt.show() and at the cell's end;
#                at most maxBytes of them in a cell
#   b"J"         JSON: {"op": "ready", "python": "3.12.1"} once at start;
#                {"op": "done", "id": N, "resultTruncated": ..., "error":
#                 {"name", "value", "traceback"} or null} after each cell,
#                after all its output frames and its result frame; the
#                error's value and traceback hold at most min(maxBytes,
#                256 KiB) bytes each.
# EOF on the private stdin ends the kernel.
import os
import sys


def _sandgate_kernel():
    import ast
    import builtins
    import fcntl
    import io
    import json
    import linecache
    import queue
    import select
    import signal
    import struct
    import termios
    import threading
    import time
    import traceback
    import types

    pid = os.getpid()
    driver_file = sys._getframe().f_code.co_filename  # "<string>"

    def private(fd):
        return fcntl.fcntl(fd, getattr(fcntl, "F_DUPFD_CLOEXEC", 1030), 200)

    proto_in, proto_out, diag = private(0), private(1), private(2)
    nul = os.open(os.devnull, os.O_RDWR)
    devnull = private(nul)
    os.close(nul)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)

    wlock = threading.Lock()
    main_thread = threading.get_ident()
    # An interrupt that comes while the main thread writes a frame waits
    # for the frame's end (a torn frame would break the channel, and the
    # kernel with it): on_sigint only notes it then.
    sigint = {"sending": 0, "pending": False}

    def send(kind, payload):
        data = memoryview(kind + struct.pack(">I", len(payload)) + payload)
        on_main = threading.get_ident() == main_thread
        if on_main:
            sigint["sending"] += 1
        try:
            with wlock:
                while data:
                    data = data[os.write(proto_out, data):]
        finally:
            if on_main:
                sigint["sending"] -= 1
        if on_main and sigint["pending"] and not sigint["sending"]:
            sigint["pending"] = False
            if running["id"] is not None:
                raise KeyboardInterrupt

    def send_json(obj):
        send(b"J", json.dumps(obj).encode("utf-8"))

    def read_exact(n):
        buf = b""
        while len(buf) < n:
            chunk = os.read(proto_in, n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    runs = queue.Queue()
    running = {"id": None}
    state_lock = threading.Lock()

    def control():
        try:
            while True:
                (n,) = struct.unpack(">I", read_exact(4))
                msg = json.loads(read_exact(n).decode("utf-8"))
                if msg.get("op") == "run":
                    runs.put(msg)
                elif msg.get("op") == "interrupt":
                    with state_lock:
                        if running["id"] is not None and running["id"] == msg.get("id"):
                            signal.pthread_kill(main_thread, signal.SIGINT)
        except BaseException:
            pass
        os._exit(0)

    def on_sigint(signum, frame):
        if running["id"] is None:
            return
        if sigint["sending"]:
            sigint["pending"] = True
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)

    pump_lock = threading.Lock()  # held by the pump between a read and its frame

    def pump(fds, wake, grace=0.5):
        # Forward what fds (fd -> frame kind) carry until each is at EOF,
        # or until grace seconds after wake is readable (the cell ended;
        # a process it left running may hold a pipe open).
        poller = select.poll()
        for fd in list(fds) + [wake]:
            poller.register(fd, select.POLLIN)
        deadline = None
        while fds:
            timeout = None
            if deadline is not None:
                timeout = max(0, int((deadline - time.monotonic()) * 1000))
            for fd, _ in poller.poll(timeout):
                if fd == wake:
                    os.read(wake, 1)
                    poller.unregister(wake)
                    deadline = time.monotonic() + grace
                    continue
                if fd not in fds:
                    continue
                with pump_lock:
                    try:
                        data = os.read(fd, 65536)
                    except OSError:
                        data = b""
                    if data:
                        send(fds[fd], data)
                if not data:
                    poller.unregister(fd)
                    del fds[fd]
                    os.close(fd)
            if deadline is not None and time.monotonic() >= deadline:
                break
        for fd in fds:
            os.close(fd)

    def text_stream(fd, mode):
        raw = io.FileIO(fd, mode, closefd=False)
        return io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace",
                                line_buffering=True, write_through=(mode == "w"))

    def restore_fds():
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)

    streams = {}

    def std_streams():
        # Fresh std streams when user code closed or replaced ours.
        for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
            s = streams.get(name)
            if s is None or s.closed:
                s = streams[name] = text_stream(fd, mode)
            setattr(sys, name, s)
            setattr(sys, "__" + name + "__", s)

    def flush_std():
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except BaseException:
                pass

    def cut(s, limit):
        # s as UTF-8 (lone surrogates escaped), at most limit bytes of it.
        b = s.encode("utf-8", "backslashreplace")
        if len(b) <= limit:
            return b, False
        return b[:limit].decode("utf-8", "ignore").encode("utf-8"), True

    def describe(e, limit):
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == driver_file:
            tb = tb.tb_next
        try:
            value = str(e)
        except BaseException:
            value = "<unprintable %s>" % type(e).__name__
        try:
            text = "".join(traceback.format_exception(type(e), e, tb))
        except BaseException:
            text = "%s: %s\n" % (type(e).__name__, value)
        sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
        limit = min(limit, 256 << 10)
        return {"name": type(e).__name__, "value": cut(value, limit)[0].decode("utf-8"),
                "traceback": cut(text, limit)[0].decode("utf-8")}

    # Display hooks, as IPython's: a value's MIME bundle from its
    # _repr_*_ methods; display(obj); matplotlib figures as PNGs, through
    # a backend of our own (module://_sandgate_inline, which this
    # process's importer provides; rcParams set when matplotlib is first
    # imported, unless MPLBACKEND says otherwise: nothing a subprocess
    # inherits).
    import base64
    import importlib.abc
    import importlib.machinery
    import importlib.util

    reprs = (("_repr_html_", "text/html"), ("_repr_markdown_", "text/markdown"),
             ("_repr_svg_", "image/svg+xml"), ("_repr_png_", "image/png"),
             ("_repr_jpeg_", "image/jpeg"), ("_repr_pdf_", "application/pdf"),
             ("_repr_latex_", "text/latex"), ("_repr_json_", "application/json"),
             ("_repr_javascript_", "application/javascript"))
    cell = {"display": False, "left": 0}

    def figure_png(fig):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        return base64.b64encode(buf.getvalue()).decode("ascii")

    def mime_bundle(obj, text=None):
        data = {}
        if not isinstance(obj, type):
            fig_mod = sys.modules.get("matplotlib.figure")
            if fig_mod is not None and isinstance(obj, fig_mod.Figure):
                data["image/png"] = figure_png(obj)
            m = getattr(obj, "_repr_mimebundle_", None)
            if callable(m):
                try:
                    r = m()
                    if isinstance(r, tuple):
                        r = r[0]
                    if isinstance(r, dict):
                        data.update(r)
                except Exception:
                    pass
            for attr, mime in reprs:
                f = getattr(obj, attr, None)
                if mime in data or not callable(f):
                    continue
                try:
                    v = f()
                except Exception:
                    continue
                if isinstance(v, tuple):
                    v = v[0]
                if isinstance(v, (bytes, bytearray)):
                    v = base64.b64encode(bytes(v)).decode("ascii")
                if v is not None:
                    data[mime] = v
        if "text/plain" not in data:
            data["text/plain"] = text if text is not None else repr(obj)
        return data

    def drain():
        # What the cell wrote to fds 1 and 2 so far, forwarded before what
        # comes next (a display must not overtake earlier output); a
        # second at most (a subprocess may write without end).
        flush_std()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            pending = 0
            with pump_lock:
                for fd in cell.get("pipes", ()):
                    try:
                        pending += struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
                    except OSError:
                        pass
            if not pending:
                return
            time.sleep(0.001)

    def send_display(data, main=False):
        if not cell["display"]:
            return
        drain()
        try:
            payload = json.dumps({"data": data, "main": main}, default=str).encode("utf-8")
        except Exception as e:
            payload = json.dumps({"data": {"text/plain": "<display not JSON: %s>" % e}, "main": main}).encode("utf-8")
        if len(payload) > cell["left"]:
            # Too large: its text/plain alone, cut to fit (the value of a
            # long expression comes back cut, as its result does); else a
            # note, which is not the cell's value.
            plain, size, cut_payload = data.get("text/plain"), len(payload), None
            room = cell["left"] - 256
            while isinstance(plain, str) and room > 0:
                p = json.dumps({"data": {"text/plain": cut(plain, room)[0].decode("utf-8")}, "main": main}).encode("utf-8")
                if len(p) <= cell["left"]:
                    cut_payload = p
                    break
                room = min(room // 2, room - (len(p) - cell["left"]))
            payload = cut_payload
            if payload is None:
                note = "<display of %d bytes dropped: a cell's rich output is bounded>" % size
                payload = json.dumps({"data": {"text/plain": note}, "main": False}).encode("utf-8")
                if len(payload) > cell["left"]:
                    return
        cell["left"] -= len(payload)
        send(b"D", payload)

    def display(*objs, **kwargs):
        for obj in objs:
            if cell["display"]:
                send_display(mime_bundle(obj))
            else:
                print(repr(obj))


    def flush_figures():
        # The open figures as displays; an error (a figure that cannot be
        # drawn) is the caller's: plt.show()'s, or the cell's.
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None or not cell["display"]:
            return
        try:
            for num in plt.get_fignums():
                fig = plt.figure(num)
                send_display({"image/png": figure_png(fig), "text/plain": repr(fig)})
        finally:
            plt.close("all")

    class InlineBackend(importlib.abc.Loader):
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            from matplotlib.backend_bases import FigureManagerBase
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            module.FigureCanvas = FigureCanvasAgg
            module.FigureManager = FigureManagerBase

            def show(*args, **kwargs):
                flush_figures()

            module.show = show

    class MatplotlibHook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "_sandgate_inline":
                return importlib.machinery.ModuleSpec(name, InlineBackend())
            if name != "matplotlib" or "MPLBACKEND" in os.environ or getattr(finding, "busy", False):
                return None
            finding.busy = True  # this thread's find_spec below: the real finders
            try:
                spec = importlib.util.find_spec(name)
            finally:
                finding.busy = False
            if spec is None or spec.loader is None:
                return spec
            real = spec.loader

            class Loader(importlib.abc.Loader):
                def create_module(self, spec):
                    return real.create_module(spec)

                def exec_module(self, module):
                    real.exec_module(module)
                    try:
                        module.rcParams["backend"] = "module://_sandgate_inline"
                    except Exception:
                        pass

            spec.loader = Loader()
            return spec

    finding = threading.local()
    hooks = {"installed": False}

    def install_display_hooks():
        # At the first cell that asks for display: a kernel only /v1's
        # plain calls use keeps Python's own builtins and matplotlib's
        # own backend.
        if hooks["installed"]:
            return
        hooks["installed"] = True
        builtins.display = display
        sys.meta_path.insert(0, MatplotlibHook())

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    ns = main.__dict__
    cells = [0]
    base_env_set = [False]

    def run_cell(msg):
        mark = msg.get("mark")
        if isinstance(mark, str) and 0 < len(mark) <= 64 and mark.isascii() and mark.isalnum():
            # Before anything of this cell: the gateway that took this
            # kernel back finds its channel again here (kernel.go, sync).
            send(b"J", ('{"op":"mark","mark":"%s"}' % mark).encode("ascii"))
        limit = int(msg.get("maxBytes", 1 << 20))
        cell["display"], cell["left"] = bool(msg.get("display")), limit
        if cell["display"]:
            install_display_hooks()
        code = msg.get("code", "")
        cells[0] += 1
        filename = "<cell-%d>" % cells[0]
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        restore_fds()  # user code may have closed them: pipes must not land there
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.close(out_w)
        os.close(err_w)
        cell["pipes"] = (out_r, err_r)
        wake_r, wake_w = os.pipe()
        pumper = threading.Thread(target=pump, args=({out_r: b"O", err_r: b"E"}, wake_r), daemon=True)
        pumper.start()
        std_streams()
        result, error = None, None
        if msg.get("baseEnv") and not base_env_set[0]:
            os.environ.update(msg["baseEnv"])
            base_env_set[0] = True
        env = msg.get("env") or {}
        env_saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            with state_lock:
                sigint["pending"] = False  # an interrupt of an earlier cell's
                running["id"] = msg.get("id")
            try:
                tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST)
                last = None
                if tree.body and isinstance(tree.body[-1], ast.Expr):
                    last = ast.Expression(tree.body.pop().value)
                exec(compile(tree, filename, "exec"), ns)
                if last is not None:
                    value = eval(compile(last, filename, "eval"), ns)
                    if value is not None:
                        result = repr(value)
                        if cell["display"]:
                            send_display(mime_bundle(value, result), main=True)
            finally:
                # The cell's figures, while it still runs: a slow savefig
                # is interrupted as the cell is; its error is the cell's.
                flush_figures()
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: the kernel stays
            with state_lock:
                running["id"] = None
            if os.getpid() != pid:
                os._exit(1)  # a fork of user code must not act as the kernel
            error = describe(e, limit)
        finally:
            with state_lock:
                running["id"] = None
        if os.getpid() != pid:
            os._exit(0)
        for k, v in env_saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        cell["display"] = False
        flush_std()
        restore_fds()
        os.write(wake_w, b"x")
        pumper.join()
        cell["pipes"] = ()
        os.close(wake_r)
        os.close(wake_w)
        truncated = False
        if result is not None:
            data, truncated = cut(result, limit)
            send(b"R", data)
        send_json({"op": "done", "id": msg.get("id"), "resultTruncated": truncated, "error": error})

    threading.Thread(target=control, daemon=True).start()
    send_json({"op": "ready", "python": "%d.%d.%d" % sys.version_info[:3]})
    try:
        while True:
            try:
                run_cell(runs.get())
            except KeyboardInterrupt:
                continue  # a late interrupt, after its cell ended
    except BaseException:
        # The kernel itself failed (its channel closed under it...): say
        # why on the real stderr, which the gateway logs.
        try:
            os.write(diag, traceback.format_exc().encode("utf-8", "replace"))
        finally:
            os._exit(70)


_sandgate_kernel()
