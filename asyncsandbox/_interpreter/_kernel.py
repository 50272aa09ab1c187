"""A context's kernel: runs the code's cells in a namespace that persists from one call to
the next, and sends what they print and display, their errors and their ends to the
supervisor (:mod:`._runner`) on its events pipe. Shipped with the runner (see
:data:`._engine.RUNNER`).
"""

from __future__ import annotations

import json
import os
import signal
import sys

TYPE_CHECKING = False  # not typing's: nothing is imported that the runner does not use
if TYPE_CHECKING:
    from typing import Any, NoReturn

    from asyncsandbox._interpreter import (
        _charts as charts,  # shipped before this file (see RUNNER)
        _common as common,  # shipped before this file (see RUNNER)
        _hooks as hooks,  # shipped before this file (see RUNNER)
    )


def kernel_main(
    cwd: str, holder_pid: int, out: int, err: int, events: int, requests: int
) -> NoReturn:
    os.setsid()
    common.prctl(common.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != holder_pid:
        os._exit(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in (null, out, err):
        if fd > 2:
            os.close(fd)
    for fd in (events, requests):
        os.set_inheritable(fd, False)  # subprocesses of the code never hold them
    kernel = Kernel(events, requests)
    try:
        os.chdir(cwd)
    except OSError as exc:
        kernel.emit({"type": "failed", "error": "cannot start in %s: %s" % (cwd, exc.strerror)})
        os._exit(1)
    kernel.setup()
    kernel.emit({"type": "ready", "pid": os.getpid()})
    kernel.serve()
    os._exit(0)


class Stream:
    """``sys.stdout``/``sys.stderr`` of a kernel: text line-buffered, then sent on the
    events pipe (so that it keeps its order with the results displayed between), dropped
    when written by a thread of an earlier call (or between calls). Descriptors 1 and 2
    stay for what writes to them (subprocesses, C code)."""

    def __init__(self, kernel: Kernel, fd: int, name: str) -> None:
        import threading

        self.kernel = kernel
        self.fd = fd
        self.kind = name
        self.name = "<%s>" % name
        self.encoding = "utf-8"
        self.errors = "surrogateescape"
        self.parts: list[str] = []
        self.size = 0
        self.lock = threading.RLock()  # re-entered by a signal handler that prints
        self.buffer = RawStream(self)

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not %s" % type(text).__name__)
        if not self.kernel.may_write():
            return len(text)
        with self.lock:
            self.parts.append(text)
            self.size += len(text)
            full = "\n" in text or self.size > 8192
        if full:
            self.flush()
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        # The lock is held to take the text, not to send it: sending may block for as
        # long as the host reads nothing, and another thread's flush must not wait for it
        # (the main thread's, reporting an interrupt).
        with self.lock:
            if not self.parts:
                return
            text, self.parts, self.size = "".join(self.parts), [], 0
        try:
            data = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = text.encode("utf-8", "backslashreplace")
        self.kernel.emit_output(self.kind, data)

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return False

    def close(self) -> None:
        pass


class RawStream:
    """``sys.stdout.buffer``: bytes, after the text written before them."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def write(self, data: Any) -> int:
        data = bytes(data)
        if self.stream.kernel.may_write():
            self.stream.flush()
            self.stream.kernel.emit_output(self.stream.kind, data)
        return len(data)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fd

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


PLAIN = (int, float, str, bool, complex, bytes)
REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_pdf_", "application/pdf"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
    ("_repr_javascript_", "application/javascript"),
)
BINARY = ("image/png", "image/jpeg", "application/pdf")


class Kernel:
    def __init__(self, events: int, requests: int) -> None:
        import threading

        self.events = events
        self.requests = requests
        self.lock = threading.Lock()  # one frame at a time on the pipe
        self.threading = threading
        self.main = threading.main_thread()
        self.call: Any = None
        self.limit = 0
        self.count = 0
        self.interruptible = False
        self.pending = False
        self.formatter: Any = None
        self.loop: Any = None
        self.namespace: dict[str, Any] = {}
        self.stdout = Stream(self, 1, "stdout")
        self.stderr = Stream(self, 2, "stderr")

    # -- setup --

    def setup(self) -> None:
        import builtins
        import types

        signal.signal(signal.SIGINT, self.on_interrupt)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.stdout = self.stdout
        sys.stderr = self.stderr
        sys.argv = [""]
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        self.namespace = main.__dict__
        builtins.display = self.display  # type: ignore[attr-defined]
        setattr(
            builtins, hooks.SHELL, hooks.Shell(self.namespace, self.flush_streams)
        )  # what `!cmd` lines call
        kernel = self
        start = self.threading.Thread.start

        def tagged_start(thread: Any) -> None:
            setattr(thread, common.TAG, kernel.tag())
            start(thread)

        setattr(self.threading.Thread, "start", tagged_start)  # noqa: B010
        sys.meta_path.insert(
            0,
            hooks.PostImport(
                {
                    "matplotlib.pyplot": self.patch_pyplot,
                    "IPython.display": self.patch_ipython,
                    "IPython.core.display_functions": self.patch_ipython,
                    "PIL.Image": self.patch_pil,
                }
            ),
        )

    def patch_pyplot(self, pyplot: Any) -> None:
        kernel = self

        def show(*args: Any, **kwargs: Any) -> None:
            kernel.show_figures()

        pyplot.show = show

    def patch_ipython(self, module: Any) -> None:
        if hasattr(module, "display"):
            module.display = self.display

    def patch_pil(self, module: Any) -> None:
        """As E2B's code interpreter: an image shown, or saved to a file name, is a result
        (``show()`` has no viewer to open here)."""
        kernel = self
        image = module.Image
        save = image.save

        def show_image(self: Any, *args: Any, **kwargs: Any) -> None:
            kernel.display(self)

        def save_image(self: Any, fp: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(fp, (str, os.PathLike)):
                kernel.display(self)
            return save(self, fp, *args, **kwargs)

        image.show = show_image
        image.save = save_image

    # -- threads and interrupts --

    def tag(self) -> Any:
        thread = self.threading.current_thread()
        if thread is self.main:
            return self.call
        return getattr(thread, common.TAG, self.call)

    def may_write(self) -> bool:
        """Whether the calling thread's output belongs to the active call."""
        call = self.call
        if call is None:
            return False
        thread = self.threading.current_thread()
        return thread is self.main or getattr(thread, common.TAG, call) == call

    def on_interrupt(self, signum: int, frame: Any) -> None:
        if self.interruptible:
            raise KeyboardInterrupt
        self.pending = True

    def enter(self) -> None:
        """Back into the code's own time: an interrupt that came meanwhile takes effect."""
        self.interruptible = True
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt

    # -- messages --

    def emit(self, header: dict[str, Any], payload: bytes = b"") -> None:
        with self.lock:
            self.send(header, payload)

    def emit_output(self, kind: str, data: bytes) -> None:
        """Output of the active call (``stdout`` or ``stderr``), in frames of at most
        OUTPUT_CHUNK bytes; none between calls. The pipe is taken for one frame at a time:
        another thread's frames may come between (its error, the call's end: the rest of
        this output is then dropped, as any output after its call)."""
        call = self.call
        for start in range(0, len(data), common.OUTPUT_CHUNK):
            with self.lock:
                if call is None or self.call != call:
                    return
                self.send({"type": kind, "call": call}, data[start : start + common.OUTPUT_CHUNK])

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        """Write one frame whole: an interrupt that comes meanwhile (the write may block
        for as long as the host reads nothing) waits for its end, then takes effect."""
        if self.threading.current_thread() is not self.main:
            # Only the main thread is interrupted (signal handlers run there): another
            # thread's write must leave its state alone, or an interrupt that comes during
            # it would be held back from the code until its next output.
            write_all(self.events, common.encode(header, payload))
            return
        interruptible, self.interruptible = self.interruptible, False
        try:
            write_all(self.events, common.encode(header, payload))
        finally:
            self.interruptible = interruptible
        if interruptible and self.pending:
            self.pending = False
            raise KeyboardInterrupt

    def read_request(self) -> tuple[dict[str, Any], bytes]:
        head = self.read_exactly(common.FRAME.size)
        size, payload = common.FRAME.unpack(head)
        header = json.loads(self.read_exactly(size))
        return header, self.read_exactly(payload)

    def read_exactly(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = os.read(self.requests, size - len(data))
            if not chunk:
                os._exit(0)  # the supervisor is gone
            data += chunk
        return bytes(data)

    # -- calls --

    def serve(self) -> None:
        while True:
            header, code = self.read_request()
            self.pending = False
            self.call = header["call"]
            self.limit = int(header["limit"])
            env = header.get("env") or {}
            saved = {key: os.environ.get(key) for key in env}
            os.environ.update(env)
            try:
                self.run(code.decode("utf-8", "surrogateescape"))
            except KeyboardInterrupt:
                pass  # an interrupt that came after the code ended
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
                self.interruptible = False
                for stream in (self.stdout, self.stderr):
                    try:
                        stream.flush()
                    except Exception:  # noqa: BLE001, S110 - a broken pipe: the call ends anyway
                        pass
                with self.lock:
                    self.send({"type": "done", "call": self.call, "count": self.count})
                    self.call = None

    def run(self, source: str) -> None:
        import linecache

        self.count += 1
        filename = "<cell-%d>" % self.count
        lines = source.splitlines(True)
        linecache.cache[filename] = (len(source), None, lines, filename)
        try:
            tree, parsed = self.parse(source, filename)
            body, last = self.split(tree, parsed)
        except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError) as exc:
            self.report(exc, compile_error=True)
            return
        try:
            try:
                self.enter()
                if body is not None:
                    self.execute(body, "exec")
                if last is not None:
                    value = self.execute(last, "eval")
                    if value is not None:
                        self.namespace["_"] = value
                        self.publish(value, main=True)
            except BaseException as exc:  # noqa: BLE001 - the code's own outcome: data
                self.interruptible = False
                self.report(exc)
            try:
                self.enter()
                self.show_figures()
            except BaseException as exc:  # noqa: BLE001
                self.interruptible = False
                self.report(exc)
        finally:
            self.interruptible = False

    def parse(self, source: str, filename: str) -> tuple[Any, str]:
        """The cell's tree, and the source it was parsed from: the cell itself, else (when
        it is not Python) the cell with its ``!cmd`` lines as calls; else the cell's own
        syntax error."""
        import ast

        try:
            return ast.parse(source, filename), source
        except SyntaxError as exc:
            error = exc
        shell = hooks.shell_lines(source)
        if shell is not None:
            try:
                return ast.parse(shell, filename), shell
            except SyntaxError:
                pass
        raise error

    def split(self, tree: Any, source: str) -> tuple[Any, Any]:
        """The cell's statements but the last expression, and that expression (``None``
        when the cell ends with another statement or with ``;``)."""
        import ast

        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not self.quiet(source):
            last = ast.Expression(tree.body.pop().value)
        body = tree if tree.body else None
        return body, last

    @staticmethod
    def quiet(source: str) -> bool:
        """The cell ends with ``;`` (as in IPython: its value is not shown)."""
        import io
        import tokenize

        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        except (tokenize.TokenError, SyntaxError):
            return False
        skip = (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER,
                tokenize.INDENT, tokenize.DEDENT)  # fmt: skip
        for token in reversed(tokens):
            if token.type not in skip:
                return token.type == tokenize.OP and token.string == ";"
        return False

    def execute(self, tree: Any, mode: str) -> Any:
        import ast

        flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
        filename = "<cell-%d>" % self.count
        code = compile(tree, filename, mode, flags=flags, dont_inherit=True)
        if code.co_flags & 0x80:  # CO_COROUTINE: top-level await
            coroutine = eval(code, self.namespace)  # running code is our job
            return self.event_loop().run_until_complete(coroutine)
        if mode == "eval":
            return eval(code, self.namespace)
        exec(code, self.namespace)
        return None

    def event_loop(self) -> Any:
        if self.loop is None:
            import asyncio

            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
        return self.loop

    def report(self, exc: BaseException, compile_error: bool = False) -> None:
        import traceback

        tb = exc.__traceback__
        while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell-"):
            tb = tb.tb_next  # from the code's first frame on, not ours
        ours = {
            getattr(function, "__func__", function).__code__
            for owner in (Kernel, Stream, RawStream, hooks.Shell)
            for function in vars(owner).values()
            if hasattr(getattr(function, "__func__", function), "__code__")
        }
        link = tb
        while link is not None:  # nor the runner's, where the code called it (print, display)
            while link.tb_next is not None and link.tb_next.tb_frame.f_code in ours:
                link.tb_next = link.tb_next.tb_next
            link = link.tb_next
        try:
            if compile_error:
                text = "".join(traceback.format_exception_only(type(exc), exc))
            else:
                text = "".join(traceback.format_exception(type(exc), exc, tb))
        except Exception:  # noqa: BLE001 - a broken __str__
            text = "%s: <unprintable>\n" % type(exc).__name__
        try:
            value = str(exc)
        except Exception:  # noqa: BLE001
            value = "<unprintable>"
        limit = max(self.limit // 2, 1024)
        if len(text) > limit:  # its end says most: where it was raised
            text = "...\n" + text[-limit:]
        error = {"name": type(exc).__name__, "value": value[:limit], "traceback": text}
        self.flush_streams()
        self.emit({"type": "error", "call": self.call}, json.dumps(error).encode())

    def flush_streams(self) -> None:
        for stream in (self.stdout, self.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - the result matters more
                pass

    # -- display --

    def display(self, *objects: Any, **kwargs: Any) -> None:
        """``display(obj, ...)``: show each object as a result now (not the main one)."""
        for obj in objects:
            if kwargs.get("raw") and isinstance(obj, dict):
                self.publish_bundle(obj, main=False)
            else:
                self.publish(obj, main=False)

    def publish(self, value: Any, main: bool) -> None:
        self.publish_bundle(self.bundle(value), main)

    def publish_bundle(self, bundle: dict[str, Any], main: bool) -> None:
        if not self.may_write():
            return
        try:
            payload = json.dumps({"data": bundle, "main": main}).encode()
        except (TypeError, ValueError) as exc:
            sys.stderr.write("display: a format is not JSON: %s\n" % exc)
            bundle = {"text/plain": bundle.get("text/plain", "")}
            payload = json.dumps({"data": bundle, "main": main}).encode()
        self.flush_streams()
        with self.lock:
            if not self.may_write():
                return
            if len(payload) > self.limit:
                self.send({"type": "result", "call": self.call, "dropped": len(payload)})
            else:
                self.send({"type": "result", "call": self.call}, payload)

    def bundle(self, obj: Any) -> dict[str, Any]:
        """The formats of ``obj``, by MIME type (binary ones base64-encoded), with its
        table as E2B's code interpreter gives it (``e2b/data``)."""
        data = self.formats(obj)
        if type(obj) not in PLAIN and not isinstance(obj, type):
            table = self.table(obj)
            if table is not None:
                data["e2b/data"] = table
        return data

    def table(self, obj: Any) -> Any:
        """A pandas DataFrame's columns (``{name: [values]}``, dates in ISO format), or
        what the object's ``_repr_e2b_data_`` gives (the two E2B's formatter knows)."""
        pandas = sys.modules.get("pandas")
        frame = getattr(pandas, "DataFrame", None)
        if frame is not None and isinstance(obj, frame):
            try:
                return {
                    str(name): json.loads(
                        obj.iloc[:, i].to_json(orient="values", date_format="iso")
                    )
                    for i, name in enumerate(obj.columns)
                }
            except Exception:  # noqa: BLE001 - a frame that will not convert: its other formats
                return None
        value = self.call_repr(obj, "_repr_e2b_data_")
        return value if isinstance(value, (dict, str)) else None

    def formats(self, obj: Any) -> dict[str, Any]:
        if type(obj) in PLAIN:
            return {"text/plain": repr(obj)}
        figure = self.figure_png(obj)
        if figure is not None:
            return figure
        formatter = self.ipython_formatter()
        if formatter is not None:
            try:
                formats, _ = formatter.format(obj)
                return {mime: self.encoded(mime, value) for mime, value in formats.items()}
            except Exception:  # noqa: BLE001, S110 - fall back to our own formatting
                pass
        data: dict[str, Any] = {}
        if not isinstance(obj, type):  # a class's _repr_*_ are unbound methods
            bundle = self.call_repr(obj, "_repr_mimebundle_")
            if isinstance(bundle, tuple):
                bundle = bundle[0]
            if isinstance(bundle, dict):
                data.update((m, self.encoded(m, v)) for m, v in bundle.items())
            for method, mime in REPR_METHODS:
                if mime in data:
                    continue
                value = self.call_repr(obj, method)
                if isinstance(value, tuple):
                    value = value[0]
                if value is not None:
                    data[mime] = self.encoded(mime, value)
        if "text/plain" not in data:
            data["text/plain"] = repr(obj)
        return data

    def call_repr(self, obj: Any, method: str) -> Any:
        try:
            function = getattr(obj, method, None)
        except Exception:  # noqa: BLE001 - a broken __getattr__
            return None
        if not callable(function):
            return None
        try:
            return function()
        except Exception:  # noqa: BLE001 - as IPython: warn, and skip that format
            import traceback

            sys.stderr.write(
                "%s of %s failed:\n%s" % (method, type(obj).__name__, traceback.format_exc())
            )
            return None

    @staticmethod
    def encoded(mime: str, value: Any) -> Any:
        if mime in BINARY and isinstance(value, (bytes, bytearray)):
            import base64

            return base64.b64encode(bytes(value)).decode("ascii")
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return value

    def ipython_formatter(self) -> Any:
        """IPython's display formatter when IPython is importable (imported on first use)."""
        if self.formatter is None:
            self.formatter = False
            try:
                import importlib.util

                if importlib.util.find_spec("IPython") is not None:
                    from IPython.core.formatters import DisplayFormatter

                    self.formatter = DisplayFormatter()
            except Exception:  # noqa: BLE001 - a broken IPython: our own formatting
                self.formatter = False
        return self.formatter or None

    def figure_png(self, obj: Any) -> dict[str, Any] | None:
        figure_type = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
        if figure_type is None or not isinstance(obj, figure_type):
            return None
        bundle = self.render(obj)
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:
            pyplot.close(obj)  # shown: not again at the end of the cell
        return bundle

    @staticmethod
    def render(figure: Any) -> dict[str, Any]:
        import base64
        import io

        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", bbox_inches="tight")  # drawn: tick labels set
        bundle: dict[str, Any] = {
            "text/plain": repr(figure),
            "image/png": base64.b64encode(buffer.getvalue()).decode("ascii"),
        }
        try:
            chart = charts.figure_chart(figure)
            size = len(json.dumps(chart))
        except Exception:  # noqa: BLE001 - a figure we cannot read: its image only
            chart, size = None, 0
        if chart and size <= charts.MAX_CHART:  # a bigger one would cost the image its room
            bundle["e2b/chart"] = chart
        return bundle

    def show_figures(self) -> None:
        """Every open matplotlib figure, as a PNG result, then closed (as a notebook's
        inline backend does at ``plt.show()`` and at the end of a cell)."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        helpers = sys.modules.get("matplotlib._pylab_helpers")
        managers = helpers.Gcf.get_all_fig_managers() if helpers is not None else []
        try:
            for manager in managers:
                self.publish_bundle(self.render(manager.canvas.figure), main=False)
        finally:
            pyplot.close("all")
