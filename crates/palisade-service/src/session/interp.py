# palisade's cell driver: a persistent Python interpreter inside a session's sandbox. The server
# writes one JSON line per cell on its stdin; it answers one JSON line on its stdout. While a cell
# runs, fds 0, 1 and 2 are /dev/null and two memory files, so the cell's output (and that of
# the processes it starts) never mixes with the answers; the control pipes are kept on private
# close-on-exec descriptors. Each answer repeats its cell's nonce. Everything here runs inside the
# boundary and is treated by the server as untrusted (lines bounded, JSON checked, every field
# held to the cap again, answers matched to their cell by the nonce).
import ast, base64, json, linecache, os, sys, traceback

_inp = os.fdopen(os.dup(0), "rb")
_out = os.fdopen(os.dup(1), "wb")
_null = os.open("/dev/null", os.O_RDONLY)
os.dup2(_null, 0)
_ns = {"__name__": "__main__", "__builtins__": __builtins__}
_n = 0


def _take(fd, cap):
    size = os.lseek(fd, 0, os.SEEK_END)
    os.lseek(fd, 0, os.SEEK_SET)
    chunks, left = [], min(size, cap)
    while left > 0:
        b = os.read(fd, min(left, 1 << 20))
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks), size > cap


def _b64(b):
    # Texts go as base64 (of their bytes; the server decodes them as UTF-8, replacing what is
    # not): an answer line is then at most 4/3 of what it holds, whatever the bytes.
    if isinstance(b, str):
        b = b.encode("utf-8", "replace")
    return base64.b64encode(b).decode("ascii")


def _cut(s, cap):
    # At most cap bytes of UTF-8, marked when cut (the server holds the answer to the same rule).
    b = s.encode("utf-8", "replace")
    if len(b) <= cap:
        return s
    if cap < 3:
        return b[:cap].decode("utf-8", "ignore")
    return b[: cap - 3].decode("utf-8", "ignore") + "…"


def _cell(src, name):
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    tree = ast.parse(src, name, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, "exec"), _ns)
    if last is not None:
        v = eval(compile(last, name, "eval"), _ns)
        if v is not None:
            _ns["_"] = v
            return repr(v)
    return None


while True:
    line = _inp.readline()
    if not line:
        break
    req = json.loads(line)
    cap = int(req["output"])
    _n += 1
    fo = os.memfd_create("stdout", os.MFD_CLOEXEC)
    fe = os.memfd_create("stderr", os.MFD_CLOEXEC)
    saved = (os.dup(1), os.dup(2))
    os.dup2(fo, 1)
    os.dup2(fe, 2)
    value = error = None
    try:
        value = _cell(req["code"], "<cell-%d>" % _n)
    except BaseException as e:  # noqa: B036 - SystemExit and KeyboardInterrupt are the cell's too
        tb = e.__traceback__
        # Drop this driver's own frames: the cell's start at its first frame named <cell-…>.
        while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell-"):
            tb = tb.tb_next
        text = "".join(traceback.format_exception(type(e), e, tb))
        try:
            shown = str(e)
        except BaseException:
            shown = "<unprintable>"
        # The name is held to 256 bytes (as the server holds it), so that an honest answer line
        # fits the server's bound whatever a class calls itself.
        error = {"name": _cut(type(e).__name__, 256), "value": _b64(_cut(shown, cap)), "traceback": _b64(_cut(text, cap))}
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    os.close(saved[0])
    os.close(saved[1])
    # The cap holds the value first, then stdout and stderr share what is left.
    value = None if value is None else _cut(value, cap)
    room = cap - (0 if value is None else len(value.encode("utf-8", "replace")))
    so, so_cut = _take(fo, room)
    se, se_cut = _take(fe, max(0, room - len(so)))
    os.close(fo)
    os.close(fe)
    ans = {
        "nonce": req["nonce"],
        "stdout": _b64(so), "stdout_truncated": so_cut, "stderr": _b64(se), "stderr_truncated": se_cut,
        "value": None if value is None else _b64(value), "error": error,
    }
    _out.write(json.dumps(ans).encode() + b"\n")
    _out.flush()
