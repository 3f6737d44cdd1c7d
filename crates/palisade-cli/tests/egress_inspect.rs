//! Egress beyond host names, against the test internet's extra servers (`scripts/testnet.sh
//! extras`: pypi.test, git.test, api.test, badcert.test): TLS inspection with the clients people
//! use, unchanged (curl, Python's urllib and requests, pip, git, Node), through the proxy and
//! transparently; HTTP rules and the read-only preset; Host fronting and keep-alive host switches;
//! the body cap; secrets that the code never holds; the run's CA key out of reach; an upstream
//! whose certificate does not verify. Each case checks what the client inside got, the report,
//! and the servers' own log (a refused request never arrives). Runs as root and as the
//! unprivileged user alike.

mod common;
#[path = "common/testnet.rs"]
mod testnet;

use common::*;
use serde_json::Value;
use testnet::*;

/// Python helpers for inside the sandbox; the test's marker is `sys.argv[1]`. No client is told
/// about any CA: what they trust is what palisade made them trust.
const HELPERS: &str = r#"
import os, socket, ssl, subprocess, sys
M = sys.argv[1]
def env(proxy):
    return {k: v for k, v in os.environ.items() if proxy or not k.lower().endswith("_proxy")}
def sh(cmd, proxy=True):
    """A command's exit status and its output (stdout, then stderr)."""
    p = subprocess.run(cmd, env=env(proxy), capture_output=True, text=True, timeout=60)
    return p.returncode, (p.stdout + p.stderr).strip()
def curl(*args, proxy=True):
    """curl's status, the response's X-Palisade-Denied (or -), and the body."""
    code, out = sh(["curl", "-sS", "--max-time", "20", "-D", "/tmp/h", *args], proxy)
    denied, status = "-", "none"
    try:
        # The last response's head (a CONNECT's own answer comes first).
        last = open("/tmp/h", newline="").read().strip().split("\r\n\r\n")[-1]
        status = last.split(" ")[1]
        for l in last.split("\r\n"):
            if l.lower().startswith("x-palisade-denied:"):
                denied = l.split(":", 1)[1].strip()
    except (OSError, IndexError):
        pass
    return f"{code} {status} {denied}", out
def say(key, v):
    print(f"{key}: {v}")
def tunnel(host, port):
    """A TLS connection to host:port through CONNECT, verified by the default context."""
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    return ssl.create_default_context().wrap_socket(s, server_hostname=host)
def exchange(s, host, path, close=False):
    """One request on an open connection: the status line and X-Palisade-Denied, or `closed`."""
    extra = "Connection: close\r\n" if close else ""
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode())
        f = s.makefile("rb")
        status = f.readline().decode().strip()
        if not status:
            return "closed"
        length, denied = 0, "-"
        while True:
            l = f.readline().decode().strip()
            if not l:
                break
            k, _, v = l.partition(":")
            if k.lower() == "content-length":
                length = int(v)
            if k.lower() == "x-palisade-denied":
                denied = v.strip()
        f.read(length)
        return f"{status.split(' ')[1]} {denied}"
    except OSError:
        return "closed"
"#;

/// The allow rules, pins and upstream CA for the extra servers, and `more`.
fn opts(names: &[&str], more: &[&str]) -> Vec<String> {
    let mut o = vec![
        "--allow-net".to_owned(),
        format!("{EXTRAS}:{EXTRAS_TLS}"),
        "--allow-net".to_owned(),
        format!("{EXTRAS}:{EXTRAS_HTTP}"),
        "--upstream-ca".to_owned(),
        upstream_ca().display().to_string(),
    ];
    for n in names {
        o.extend([
            "--allow-net".to_owned(),
            format!("{n}:{EXTRAS_TLS}"),
            "--allow-net".to_owned(),
            format!("{n}:{EXTRAS_HTTP}"),
            "--resolve".to_owned(),
            format!("{n}={EXTRAS}"),
        ]);
    }
    o.extend(more.iter().map(|s| s.to_string()));
    o
}

fn py(opts: &[String], marker: &str, script: &str) -> Run {
    let mut o: Vec<String> = opts.to_vec();
    o.extend(["--json", "-", "--timeout", "180s"].map(String::from));
    let o: Vec<&str> = o.iter().map(String::as_str).collect();
    let code = format!("{HELPERS}\n{script}");
    run(&o, &["python3", "-c", &code, marker])
}

/// The request events for a path containing `needle`.
fn requests(r: &Run, needle: &str) -> Vec<Value> {
    events(r)
        .into_iter()
        .filter(|e| {
            e["request"]["path"]
                .as_str()
                .is_some_and(|p| p.contains(needle))
        })
        .collect()
}

/// The paths of the requests the extra servers got with `marker` in them.
fn arrived(marker: &str) -> Vec<String> {
    extras_seen(marker)
        .into_iter()
        .filter(|e| e["event"] == "request")
        .map(|e| e["path"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[test]
fn clients_work_unchanged_through_inspection_by_proxy_and_transparently() {
    require_extras();
    let m = unique("clients");
    let o = opts(&["pypi.test", "git.test", "api.test"], &["--inspect"]);
    let r = py(
        &o,
        &m,
        r#"
api = "https://api.test:4443"
for proxy in (True, False):
    way = "proxy" if proxy else "transparent"
    code, out = sh(["curl", "-sS", "--max-time", "20", f"{api}/{M}/curl-{way}"], proxy)
    say(f"curl {way}", code == 0 and f"path=/{M}/curl-{way}" in out or out)
    code, out = sh(["python3", "-c", f"import urllib.request; print(urllib.request.urlopen('{api}/{M}/urllib-{way}').read().decode())"], proxy)
    say(f"urllib {way}", code == 0 and f"/{M}/urllib-{way}" in out or out)
    req = "try:\n import requests\nexcept ImportError:\n import pip._vendor.requests as requests\n"
    req += f"print(requests.get('{api}/{M}/requests-{way}').text)"
    code, out = sh(["python3", "-c", req], proxy)
    say(f"requests {way}", code == 0 and f"/{M}/requests-{way}" in out or out)
    d = f"/tmp/dl-{way}"
    code, out = sh(["python3", "-m", "pip", "download", "--no-deps", "-q", "-d", d, "--index-url",
                    f"https://pypi.test:4443/simple/", "tinypkg"], proxy)
    say(f"pip {way}", code == 0 and os.listdir(d) == ["tinypkg-1.0-py3-none-any.whl"] or out)
    g = f"/tmp/git-{way}"
    code, out = sh(["git", "clone", "-q", f"https://git.test:4443/repo.git", g], proxy)
    say(f"git {way}", code == 0 and open(f"{g}/README").read().strip() or out)
# Node's fetch ignores the proxy variables: it takes the transparent path.
code, out = sh(["node", "-e", f"fetch('{api}/{M}/node').then(r => r.text()).then(t => console.log(t)).catch(e => {{ console.log(String(e.cause || e)); process.exit(1) }})"], False)
say("node transparent", code == 0 and f"/{M}/node" in out or out)
"#,
    );
    for way in ["proxy", "transparent"] {
        for client in ["curl", "urllib", "requests", "pip"] {
            assert_eq!(
                said(&r, &format!("{client} {way}")),
                "True",
                "{client} {way}"
            );
        }
        assert_eq!(said(&r, &format!("git {way}")), "palisade test repository");
    }
    assert_eq!(said(&r, "node transparent"), "True");
    // Each request is in the report, read inside TLS: by way, method, path, status.
    for (name, via) in [
        ("curl-proxy", "http-connect"),
        ("curl-transparent", "transparent"),
        ("urllib-proxy", "http-connect"),
        ("requests-transparent", "transparent"),
        ("node", "transparent"),
    ] {
        let e = requests(&r, &format!("/{m}/{name}"));
        assert_eq!(e.len(), 1, "{name}: {e:#?}");
        assert_eq!(
            (&e[0]["via"], &e[0]["decision"], &e[0]["inspected"]),
            (
                &Value::from(via),
                &Value::from("allowed"),
                &Value::from(true)
            ),
            "{name}"
        );
        assert_eq!(e[0]["request"]["method"], "GET");
        assert_eq!(e[0]["request"]["status"], 200);
    }
    let git = events(&r)
        .into_iter()
        .filter(|e| e["host"] == "git.test" && e["request"]["method"] == "POST")
        .count();
    assert!(git >= 2, "git's upload-pack POSTs: {git}");
    let pip = requests(&r, "/packages/tinypkg-1.0-py3-none-any.whl");
    assert_eq!(pip.len(), 2, "{pip:#?}");
    // The servers got every request over the proxy's own TLS, with the host's name.
    for name in ["curl-proxy", "curl-transparent", "node"] {
        let got = extras_seen(&format!("/{m}/{name}"));
        assert_eq!(got.len(), 1, "{got:#?}");
        assert_eq!(got[0]["sni"], "api.test");
    }
}

#[test]
fn http_rules_allow_and_refuse_methods_and_paths_and_refused_requests_never_arrive() {
    require_extras();
    let m = unique("rules");
    let o = opts(
        &["pypi.test", "api.test"],
        &[
            "--http-rule",
            "GET,HEAD pypi.test:4443/simple/**",
            "--http-rule",
            "POST api.test/upload/*",
        ],
    );
    let r = py(
        &o,
        &m,
        r#"
say("simple", curl(f"https://pypi.test:4443/simple/{M}/")[0])
say("simple head", curl("-I", f"https://pypi.test:4443/simple/{M}/head")[0])
say("packages", curl(f"https://pypi.test:4443/packages/{M}.whl")[0])
say("post simple", curl("-d", "x", f"https://pypi.test:4443/simple/{M}/post")[0])
say("dot segments", curl("--path-as-is", f"https://pypi.test:4443/simple/../packages/{M}")[0])
say("upload", curl("-d", "x", f"https://api.test:4443/upload/{M}")[0])
say("upload deeper", curl("-d", "x", f"https://api.test:4443/upload/{M}/x")[0])
say("api get", curl(f"https://api.test:4443/{M}/get")[0])
say("transparent packages", curl(f"https://pypi.test:4443/packages/{M}-t.whl", proxy=False)[0])
code, out = sh(["python3", "-m", "pip", "download", "--no-deps", "-q", "-d", "/tmp/d", "--index-url",
                "https://pypi.test:4443/simple/", "tinypkg"])
say("pip", code)
"#,
    );
    // The status the client saw, then palisade's code for a refusal.
    assert_eq!(
        said(&r, "simple"),
        "0 404 -",
        "allowed; the server has no such page"
    );
    assert_eq!(said(&r, "simple head"), "0 404 -");
    assert_eq!(said(&r, "packages"), "0 403 http-rule");
    assert_eq!(said(&r, "post simple"), "0 403 http-rule");
    assert_eq!(said(&r, "dot segments"), "0 403 http-rule");
    assert_eq!(said(&r, "upload"), "0 200 -");
    assert_eq!(said(&r, "upload deeper"), "0 403 http-rule");
    assert_eq!(said(&r, "api get"), "0 403 http-rule");
    assert_eq!(said(&r, "transparent packages"), "0 403 http-rule");
    assert_ne!(
        said(&r, "pip"),
        "0",
        "pip needs /packages/, which no rule allows"
    );
    let denied: Vec<Value> = requests(&r, &m)
        .into_iter()
        .filter(|e| e["decision"] == "denied")
        .collect();
    assert_eq!(denied.len(), 6, "{denied:#?}");
    for e in &denied {
        assert_eq!(e["reason"], "http-rule");
        assert_eq!(e["request"]["status"], 403);
    }
    let ok = requests(&r, &format!("/upload/{m}"));
    assert_eq!(ok[0]["request"]["rule"], "POST api.test/upload/*");
    let mut got = arrived(&m);
    got.sort();
    let mut want = vec![
        format!("/simple/{m}/"),
        format!("/simple/{m}/head"),
        format!("/upload/{m}"),
    ];
    want.sort();
    assert_eq!(got, want, "only the allowed requests reached a server");
}

#[test]
fn the_read_only_preset_refuses_an_upload_by_every_client_and_way() {
    require_extras();
    let m = unique("readonly");
    std::fs::write(
        std::env::temp_dir().join(format!("{m}.bin")),
        vec![b'x'; 4096],
    )
    .unwrap();
    let o = opts(&["api.test"], &["--net-read-only"]);
    let r = py(
        &o,
        &m,
        r#"
with open("/tmp/upload.bin", "wb") as f:
    f.write(b"s" * 4096)
say("get", curl(f"https://api.test:4443/{M}/get")[0])
say("post", curl("--data-binary", "@/tmp/upload.bin", f"https://api.test:4443/{M}/post")[0])
say("put transparent", curl("-T", "/tmp/upload.bin", f"https://api.test:4443/{M}/put", proxy=False)[0])
say("post plain", curl("-d", "x", f"http://api.test:8088/{M}/plain")[0])
req = "try:\n import requests\nexcept ImportError:\n import pip._vendor.requests as requests\n"
req += f"r = requests.post('https://api.test:4443/{M}/requests', data=b'x' * 100)\nprint(r.status_code, r.headers.get('X-Palisade-Denied'))"
say("requests", sh(["python3", "-c", req])[1])
say("options", curl("-X", "OPTIONS", f"https://api.test:4443/{M}/options")[0])
"#,
    );
    assert_eq!(said(&r, "get"), "0 200 -");
    assert_eq!(said(&r, "post"), "0 403 http-rule");
    assert_eq!(said(&r, "put transparent"), "0 403 http-rule");
    assert_eq!(said(&r, "post plain"), "0 403 http-rule");
    assert_eq!(said(&r, "requests"), "403 http-rule");
    assert_eq!(said(&r, "options"), "0 200 -");
    let mut got = arrived(&m);
    got.sort();
    assert_eq!(got, [format!("/{m}/get"), format!("/{m}/options")]);
    assert!(
        extras_seen(&m).iter().all(|e| e["body_len"] == 0),
        "no upload's body arrived"
    );
}

#[test]
fn host_fronting_and_keep_alive_host_switches_are_refused_in_tls_and_plain_http() {
    require_extras();
    let m = unique("front");
    let o = opts(&["api.test", "pypi.test"], &["--inspect"]);
    let r = py(
        &o,
        &m,
        r#"
s = tunnel("api.test", 4443)
say("first", exchange(s, "api.test", f"/{M}/first"))
say("second", exchange(s, "api.test", f"/{M}/second"))
say("switch", exchange(s, "pypi.test", f"/{M}/switch"))
say("after switch", exchange(s, "api.test", f"/{M}/after"))
s = tunnel("api.test", 4443)
say("fronting", exchange(s, "pypi.test", f"/{M}/fronting"))
# Transparently, with the names the DNS stub handed out.
t = ssl.create_default_context().wrap_socket(socket.create_connection(("api.test", 4443), timeout=20), server_hostname="api.test")
say("t first", exchange(t, "api.test", f"/{M}/t-first"))
say("t switch", exchange(t, "pypi.test", f"/{M}/t-switch"))
# Plain HTTP: a keep-alive connection cannot switch hosts either.
p = socket.create_connection(("api.test", 8088), timeout=20)
say("plain first", exchange(p, "api.test", f"/{M}/plain-first"))
say("plain switch", exchange(p, "pypi.test", f"/{M}/plain-switch"))
"#,
    );
    assert_eq!(said(&r, "first"), "200 -");
    assert_eq!(said(&r, "second"), "200 -", "keep-alive is kept");
    assert_eq!(said(&r, "switch"), "403 host-header-mismatch");
    assert_eq!(said(&r, "after switch"), "closed");
    assert_eq!(said(&r, "fronting"), "403 host-header-mismatch");
    assert_eq!(said(&r, "t first"), "200 -");
    assert_eq!(said(&r, "t switch"), "403 host-header-mismatch");
    assert_eq!(said(&r, "plain first"), "200 -");
    assert_eq!(said(&r, "plain switch"), "403 host-header-mismatch");
    let mut got = arrived(&m);
    got.sort();
    let mut want: Vec<String> = ["first", "second", "t-first", "plain-first"]
        .iter()
        .map(|p| format!("/{m}/{p}"))
        .collect();
    want.sort();
    assert_eq!(got, want);
    let e = requests(&r, &format!("/{m}/fronting"));
    assert_eq!(e[0]["reason"], "host-header-mismatch");
    assert!(
        e[0]["detail"]
            .as_str()
            .unwrap()
            .contains("is not the TLS server name's host api.test"),
        "{}",
        e[0]["detail"]
    );
}

#[test]
fn the_body_cap_refuses_larger_bodies_by_length_and_chunked() {
    require_extras();
    let m = unique("body");
    let o = opts(&["api.test"], &["--inspect", "--max-request-body", "1KiB"]);
    let r = py(
        &o,
        &m,
        r#"
with open("/tmp/small", "wb") as f:
    f.write(b"s" * 1000)
with open("/tmp/large", "wb") as f:
    f.write(b"l" * 5000)
say("small", curl("--data-binary", "@/tmp/small", f"https://api.test:4443/{M}/small")[0])
say("large", curl("--data-binary", "@/tmp/large", f"https://api.test:4443/{M}/large")[0])
say("chunked", curl("-H", "Transfer-Encoding: chunked", "--data-binary", "@/tmp/large", f"https://api.test:4443/{M}/chunked")[0])
say("chunked small", curl("-H", "Transfer-Encoding: chunked", "--data-binary", "@/tmp/small", f"https://api.test:4443/{M}/chunked-small")[0])
"#,
    );
    assert_eq!(said(&r, "small"), "0 200 -");
    assert_eq!(said(&r, "large"), "0 403 body-too-large");
    assert_eq!(said(&r, "chunked"), "0 403 body-too-large");
    assert_eq!(said(&r, "chunked small"), "0 200 -");
    let mut got: Vec<(String, i64)> = extras_seen(&m)
        .into_iter()
        .filter(|e| e["event"] == "request")
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_owned(),
                e["body_len"].as_i64().unwrap(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (format!("/{m}/chunked-small"), 1000),
            (format!("/{m}/small"), 1000)
        ]
    );
}

#[test]
fn a_secret_goes_to_its_host_only_and_is_never_readable_inside() {
    require_extras();
    let m = unique("secret");
    let value = format!("s3cr3t-{}", unique("v"));
    let o = opts(
        &["api.test", "pypi.test"],
        &[
            "--secret",
            "TOKEN@api.test:4443=env:PALISADE_T_TOKEN",
            "--inspect",
        ],
    );
    let mut o2: Vec<String> = o.clone();
    o2.extend(["--json", "-", "--timeout", "180s"].map(String::from));
    let o2: Vec<&str> = o2.iter().map(String::as_str).collect();
    // The script searches for the value, which it builds from two halves that are never
    // together in any variable or argument of the sandbox.
    let (x, y) = value.split_at(value.len() / 2);
    let code = format!("{HELPERS}\nsys.argv.append({x:?} + {y:?})\n{SECRET_SCRIPT}");
    let mut c = command(&o2, &["python3", "-c", &code, &m]);
    c.env("PALISADE_T_TOKEN", &value);
    let r: Run = c.output().expect("palisade could not be started").into();
    assert_eq!(said(&r, "placeholder"), "True");
    assert_eq!(said(&r, "used"), "0 200 -");
    assert_eq!(said(&r, "used transparent"), "0 200 -");
    assert_eq!(said(&r, "elsewhere"), "0 403 secret-elsewhere");
    assert_eq!(said(&r, "in url"), "0 403 secret-elsewhere");
    assert_eq!(said(&r, "plain"), "0 403 secret-elsewhere");
    let reflected = said(&r, "reflected");
    assert!(
        reflected.contains("Bearer palisade-secret-") && !reflected.contains(&value),
        "{reflected}"
    );
    assert_eq!(said(&r, "found"), "[]");
    // The server got the value, in the header the code put the placeholder in.
    let used = extras_seen(&format!("/{m}/used"));
    let auth: Vec<&str> = used
        .iter()
        .filter(|e| e["event"] == "request")
        .filter_map(|e| e["auth"].as_str().or(e["x_token"].as_str()))
        .collect();
    assert_eq!(auth, [format!("Bearer {value}"), value.clone()]);
    let mut got = arrived(&m);
    got.sort();
    assert_eq!(
        got,
        [
            format!("/reflect/{m}"),
            format!("/{m}/used"),
            format!("/{m}/used-t")
        ]
    );
    // The report names the secret, never its value; nor does anything palisade printed.
    let e = requests(&r, &format!("/{m}/used"));
    assert_eq!(e[0]["request"]["secrets"], serde_json::json!(["TOKEN"]));
    let e = requests(&r, &format!("/{m}/elsewhere"));
    assert_eq!(e[0]["reason"], "secret-elsewhere");
    assert!(
        e[0]["detail"].as_str().unwrap().contains("secret TOKEN"),
        "{}",
        e[0]["detail"]
    );
    assert!(!r.stdout.contains(&value) && !r.stderr.contains(&value));
}

/// The secret test's script; the value to search for is the last of `sys.argv`.
const SECRET_SCRIPT: &str = r#"
tok = os.environ["TOKEN"]
say("placeholder", tok.startswith("palisade-secret-") and len(tok) == 56)
say("used", curl("-H", f"Authorization: Bearer {tok}", f"https://api.test:4443/{M}/used")[0])
say("used transparent", curl("-H", f"X-Token: {tok}", f"https://api.test:4443/{M}/used-t", proxy=False)[0])
say("elsewhere", curl("-H", f"Authorization: Bearer {tok}", f"https://pypi.test:4443/{M}/elsewhere")[0])
say("in url", curl(f"https://pypi.test:4443/{M}/url?k={tok}")[0])
say("plain", curl("-H", f"Authorization: Bearer {tok}", f"http://api.test:8088/{M}/plain")[0])
code, out = sh(["curl", "-sS", "-D", "-", "-o", "/dev/null", "-H", f"Authorization: Bearer {tok}", f"https://api.test:4443/reflect/{M}"])
say("reflected", [l for l in out.splitlines() if l.lower().startswith("x-seen-authorization")])
secret = sys.argv.pop()
found = [k for k, v in os.environ.items() if secret in v]
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        for f in ("environ", "cmdline"):
            try:
                if secret.encode() in open(f"/proc/{pid}/{f}", "rb").read():
                    found.append(f"/proc/{pid}/{f}")
            except OSError:
                pass
code, out = sh(["grep", "-rlsF", secret, "/etc", "/tmp", "/workspace", "/dev/shm"])
found += out.split()
say("found", found)
"#;

#[test]
fn a_secret_without_a_value_on_the_host_is_refused_at_start() {
    let r: Run = command(
        &["--allow-net", "api.test", "--secret", "TOKEN@api.test"],
        &["true"],
    )
    .env_remove("TOKEN")
    .output()
    .unwrap()
    .into();
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("--secret `TOKEN@api.test`: `TOKEN` is not set in palisade's environment"),
        "{}",
        r.stderr
    );
    let r: Run = command(
        &[
            "--allow-net",
            "api.test",
            "--secret",
            "TOKEN@api.test=file:/nonexistent/token",
        ],
        &["true"],
    )
    .output()
    .unwrap()
    .into();
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(
        r.stderr.contains("cannot read /nonexistent/token"),
        "{}",
        r.stderr
    );
}

#[test]
fn bad_rules_and_inspection_of_a_plain_port_are_refused_at_start() {
    for (args, want) in [
        (
            vec!["--allow-net", "pypi.org", "--http-rule", "get pypi.org"],
            "invalid --http-rule `get pypi.org`: expected methods in upper case",
        ),
        (
            vec![
                "--allow-net",
                "pypi.org",
                "--http-rule",
                "GET pypi.org/a/**b",
            ],
            "invalid --http-rule `/a/**b`: expected `**` only as a whole segment",
        ),
        (
            vec!["--allow-net", "pypi.org", "--inspect", "pypi.org:80"],
            "invalid --inspect `pypi.org:80`: expected a TLS port",
        ),
        (
            vec!["--http-rule", "read-only *"],
            "invalid --http-rule `(given)`: expected --allow-net rules as well",
        ),
        (
            vec![
                "--allow-net",
                "pypi.org",
                "--http-rule",
                "GET pypi.org",
                "--no-inspect",
                "pypi.org",
            ],
            "invalid --no-inspect `pypi.org`: expected a host no --http-rule rule names",
        ),
        (
            vec![
                "--allow-net",
                "pypi.org",
                "--inspect",
                "--upstream-ca",
                "/nonexistent/ca.pem",
            ],
            "--upstream-ca `/nonexistent/ca.pem`: No such file or directory",
        ),
    ] {
        let r: Run = command(&args, &["true"]).output().unwrap().into();
        assert_eq!(r.code, 125, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(want), "{args:?}: {}", r.stderr);
    }
}

#[test]
fn the_ca_key_is_never_reachable_inside_and_the_host_bundle_is_untouched() {
    require_extras();
    let m = unique("cakey");
    let bundle = "/etc/ssl/certs/ca-certificates.crt";
    let before = std::fs::read(bundle).expect("the host's CA bundle");
    let o = opts(&["api.test"], &["--inspect"]);
    let script = r#"
# A PEM private key anywhere the code can read text, or in any process's environment (the
# marker is put together here, so that this script's own command line does not hold it).
marker = "PRIVATE" + " KEY-----"
code, out = sh(["grep", "-rlsIF", marker, "/etc", "/tmp", "/workspace", "/dev/shm"])
found = out.split()
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            if marker.encode() in open(f"/proc/{pid}/environ", "rb").read():
                found.append(f"/proc/{pid}/environ")
        except OSError:
            pass
say("keys", found)
ca = open("/etc/palisade/ca.pem").read()
say("ca", ca.count("BEGIN CERTIFICATE"))
bundle = open("/etc/ssl/certs/ca-certificates.crt").read()
say("bundle ends with ca", bundle.rstrip().endswith(ca.strip()))
code, out = sh(["openssl", "x509", "-noout", "-subject", "-in", "/etc/palisade/ca.pem"])
say("subject", out)
# The leaf the proxy serves is signed by that CA: verified against it alone.
ctx = ssl.create_default_context(cafile="/etc/palisade/ca.pem")
s = ctx.wrap_socket(socket.create_connection(("api.test", 4443), timeout=20), server_hostname="api.test")
cert = s.getpeercert()
say("leaf", [v for f in cert["subject"] for k, v in f if k == "commonName"])
say("leaf issuer", [v for f in cert["issuer"] for k, v in f if k == "organizationName"])
"#;
    let a = py(&o, &m, script);
    let b = py(&o, &m, script);
    for r in [&a, &b] {
        assert_eq!(said(r, "keys"), "[]");
        assert_eq!(said(r, "ca"), "1");
        assert_eq!(said(r, "bundle ends with ca"), "True");
        assert_eq!(said(r, "leaf"), "['api.test']");
        assert_eq!(said(r, "leaf issuer"), "['palisade sandbox']");
    }
    // A new CA for each run.
    assert!(said(&a, "subject").contains("palisade inspection CA (one run, "));
    assert_ne!(said(&a, "subject"), said(&b, "subject"));
    assert_eq!(std::fs::read(bundle).unwrap(), before, "the host's bundle");
}

#[test]
fn an_upstream_whose_certificate_does_not_verify_gets_a_502_and_no_request() {
    require_extras();
    let m = unique("badcert");
    let o = opts(&["badcert.test", "api.test"], &["--inspect"]);
    let r = py(
        &o,
        &m,
        r#"
status, body = curl(f"https://badcert.test:4443/{M}/bad")
say("bad", status)
say("why", body.splitlines()[-1] if body else "")
say("transparent", curl(f"https://badcert.test:4443/{M}/bad-t", proxy=False)[0])
"#,
    );
    assert_eq!(said(&r, "bad"), "0 502 upstream-certificate");
    assert!(
        said(&r, "why").contains("does not verify"),
        "{}",
        said(&r, "why")
    );
    assert_eq!(said(&r, "transparent"), "0 502 upstream-certificate");
    assert!(arrived(&m).is_empty(), "{:#?}", arrived(&m));
    let e = requests(&r, &format!("/{m}/bad"));
    assert_eq!(e[0]["reason"], "upstream-certificate");
    assert!(
        e[0]["detail"].as_str().unwrap().contains("NotValidForName"),
        "{}",
        e[0]["detail"]
    );
    // Without the test CA, the host's trust store does not know api.test's issuer either.
    let mut o: Vec<String> = opts(&["api.test"], &["--inspect"]);
    let at = o.iter().position(|x| x == "--upstream-ca").unwrap();
    o.drain(at..at + 2);
    let r = py(
        &o,
        &m,
        r#"say("host store", curl(f"https://api.test:4443/{M}/host-store")[0])"#,
    );
    assert_eq!(said(&r, "host store"), "0 502 upstream-certificate");
    assert!(arrived(&m).is_empty());
}

#[test]
fn the_report_lists_each_request_with_the_query_left_out() {
    require_extras();
    let m = unique("report");
    let o = opts(&["api.test"], &["--inspect"]);
    let r = py(
        &o,
        &m,
        r#"
say("get", curl(f"https://api.test:4443/{M}/q?token=hunter2&x=1")[0])
say("bytes", curl(f"https://api.test:4443/bytes/4096?{M}")[0])
"#,
    );
    assert_eq!(said(&r, "get"), "0 200 -");
    let e = requests(&r, &format!("/{m}/q"));
    assert_eq!(e[0]["request"]["path"], format!("/{m}/q?[redacted]"));
    assert!(
        !r.stdout.contains("hunter2"),
        "the query is never in the report"
    );
    let e = requests(&r, "/bytes/4096");
    assert!(
        e[0]["bytes_in"].as_u64().unwrap() > 4096,
        "the response's bytes: {}",
        e[0]
    );
    assert_eq!(e[0]["request"]["status"], 200);
}

/// Without egress, the report says what the code tried to reach: names it looked up (counted
/// per name), the addresses and ports it connected to, TCP or UDP, IPv4 or IPv6, with counts;
/// the connections fail as before. At most 256 destinations are listed, the rest counted.
#[test]
fn a_run_without_egress_reports_what_it_tried_to_reach() {
    let m = unique("attempts");
    let code = format!(
        r#"
import errno, socket
def tcp(a, p, fam=socket.AF_INET):
    s = socket.socket(fam)
    try:
        s.connect((a, p))
        return "REACHED"
    except OSError as e:
        return errno.errorcode[e.errno]
print("tcp:", tcp("198.51.100.10", 443), tcp("198.51.100.10", 443), tcp("2001:db8:5::10", 8443, socket.AF_INET6))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.connect(("198.51.100.53", 53))
    print("udp: connected")
except OSError as e:
    print("udp:", errno.errorcode[e.errno])
for _ in range(3):
    try:
        socket.getaddrinfo("{m}.exfil.test", 443)
        print("lookup: RESOLVED")
    except socket.gaierror:
        print("lookup: failed")
for p in range(1, 301):
    tcp("198.18.0.10", p)
"#
    );
    let r = run(&["--json", "-"], &["python3", "-c", &code]);
    let tcp = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("tcp: "))
        .unwrap_or_else(|| panic!("{}\n{}", r.stdout, r.stderr));
    assert_eq!(tcp, "EACCES EACCES EACCES", "refused as before");
    assert!(r.stdout.contains("udp: ENETUNREACH"), "{}", r.stdout);
    assert!(r.stdout.contains("lookup: failed"), "{}", r.stdout);
    let net = &r.report()["network"];
    assert_eq!(net["mode"], "none");
    assert!(net["events"].as_array().unwrap().is_empty());
    let attempts = net["attempts"].as_array().unwrap();
    let find = |f: &dyn Fn(&Value) -> bool| attempts.iter().find(|a| f(a)).cloned();
    let name = find(&|a| a["name"] == format!("{m}.exfil.test")).expect("the name");
    assert_eq!(name["protocol"], "dns");
    assert!(name["count"].as_u64().unwrap() >= 3, "{name}");
    let web = find(&|a| a["address"] == "198.51.100.10" && a["port"] == 443).expect("web");
    assert_eq!(
        (&web["protocol"], &web["count"]),
        (&Value::from("tcp"), &Value::from(2))
    );
    let v6 = find(&|a| a["address"] == "[2001:db8:5::10]").expect("v6");
    assert_eq!(
        (&v6["port"], &v6["protocol"]),
        (&Value::from(8443), &Value::from("tcp"))
    );
    let udp = find(&|a| a["address"] == "198.51.100.53").expect("udp");
    assert_eq!(
        (&udp["port"], &udp["protocol"]),
        (&Value::from(53), &Value::from("udp"))
    );
    // Bounded: 256 destinations listed, the rest of the 300 ports only counted.
    assert_eq!(
        attempts.iter().filter(|a| a["address"].is_string()).count(),
        256
    );
    // 303 destinations (the two connects to .10:443 are one): 47 past the 256.
    assert_eq!(net["attempts_dropped"], 303 - 256);
}

/// The supervisor's `Threads:` in /proc (`None` once it has exited).
fn threads_of(pid: u32) -> Option<usize> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

/// What inspection costs the supervisor stays bounded whatever the sandbox does: 300 TLS
/// connections that each send 60 KB of a request head and never finish it hold at most the
/// connection cap's threads, each is cut at the first-bytes deadline, and 3,000 requests on one
/// keep-alive connection leave a bounded report; the supervisor's peak memory stays small.
#[test]
fn slow_tls_clients_huge_heads_and_endless_requests_keep_the_supervisor_bounded() {
    require_extras();
    const CAP: usize = 128;
    let dir = TempDir::new("inspect-bounds");
    let report = dir.path().join("r.json");
    let script = format!(
        r#"{HELPERS}
import time
def slow(n):
    conns = []
    for i in range(n):
        try:
            s = tunnel("api.test", 4443)
            s.sendall(b"GET / HTTP/1.1\r\nHost: api.test\r\nX: " + b"y" * 60000)
            conns.append(s)
        except OSError:
            pass
    print("opened", len(conns), flush=True)
    cut = 0
    for s in conns:
        s.settimeout(60)
        try:
            if s.recv(100).startswith(b"HTTP/1.1 400"):
                cut += 1
        except OSError:
            pass
    print("cut", cut, flush=True)
for p in range(3):
    if os.fork() == 0:
        slow(100)
        os._exit(0)
for p in range(3):
    os.wait()
s = tunnel("api.test", 4443)
ok = sum(exchange(s, "api.test", f"/{{i}}") == "200 -" for i in range(3000))
print("requests", ok, flush=True)
"#
    );
    let mut o = opts(&["api.test"], &["--inspect"]);
    let json = report.display().to_string();
    o.extend(["--json", &json, "--timeout", "300s"].map(String::from));
    let o: Vec<&str> = o.iter().map(String::as_str).collect();
    let mut c = command(&o, &["python3", "-c", &script, "bounds"]);
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    #[allow(
        clippy::zombie_processes,
        reason = "reaped by wait4 below, which also gives its rusage"
    )]
    let mut child = c.spawn().expect("palisade could not be started");
    let pid = child.id();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        let _ = std::io::Read::read_to_string(&mut std::io::BufReader::new(stdout), &mut all);
        all
    });
    let mut most = 0;
    while let Some(n) = threads_of(pid) {
        most = most.max(n);
        std::thread::sleep(std::time::Duration::from_millis(50));
        if std::fs::metadata(&report).is_ok() {
            break;
        }
    }
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our own child, not waited for yet; both pointers are to live locals.
    let r = unsafe { libc::wait4(pid as i32, &mut status, 0, &mut usage) };
    assert_eq!(r, pid as i32, "{}", std::io::Error::last_os_error());
    let out = reader.join().unwrap();
    assert!(most <= CAP + 16, "the supervisor ran {most} threads\n{out}");
    let opened: usize = out
        .lines()
        .filter_map(|l| l.strip_prefix("opened "))
        .map(|n| n.parse::<usize>().unwrap())
        .sum();
    let cut: usize = out
        .lines()
        .filter_map(|l| l.strip_prefix("cut "))
        .map(|n| n.parse::<usize>().unwrap())
        .sum();
    assert!(opened >= CAP, "{out}");
    assert_eq!(cut, opened, "each one answered 400 at the deadline\n{out}");
    assert!(out.contains("requests 3000"), "{out}");
    let rss = usage.ru_maxrss as u64 * 1024;
    assert!(rss < 128 << 20, "the supervisor's peak RSS was {rss} bytes");
    let size = std::fs::metadata(&report).unwrap().len();
    assert!(size < 16 << 20, "a {size}-byte report");
    eprintln!("inspection bounds: {most} threads at most, peak RSS {rss} bytes, report {size} bytes, {opened} connections opened");
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert!(r["network"]["refused_connections"].as_u64().unwrap() > 0);
    assert!(r["network"]["allowed"].as_u64().unwrap() > 3000);
}

/// The registry profiles inspect their hosts (and pypi's reads only), as measured and decided in
/// docs/profiles.md.
#[test]
fn the_registry_profiles_inspect_and_pypi_reads_only() {
    for (profile, want) in [
        (
            "pypi",
            "inspect = true\nno_inspect = []\nhttp = [\"GET,HEAD,OPTIONS pypi.org\", \"GET,HEAD,OPTIONS files.pythonhosted.org\"]\n",
        ),
        ("npm", "inspect = true\nno_inspect = []\nhttp = []\n"),
    ] {
        let o = std::process::Command::new(palisade_bin())
            .args(["policy", "show", "--profile", profile])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success() && out.contains(want), "{profile}:\n{out}");
    }
}
