//! `palisade serve` over real sockets with real sandboxes: every endpoint, bad input, sessions,
//! file transfer attacks, the queue, SIGTERM under load, clients that go away, and veRL's own
//! SandboxFusion client. Each test starts its own server on a unix socket (or loopback TCP) in a
//! temporary directory; they run as root and as the unprivileged test user (scripts/test.sh).

mod common;

use common::serve::{
    assert_nothing_held, held, request, run_cgroups, send, serve_on, wait_until, within,
    zygotes_of, Reap, Resp, Server, POLICY,
};
use common::{ci_tool, host_pids_with, palisade_bin, unique, TempDir};
use serde_json::{json, Value};
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};

#[test]
fn every_endpoint_answers() {
    let s = Server::start(POLICY, &[]);
    assert_eq!(s.get("/healthz").status, 200);
    assert_eq!(s.get("/readyz").status, 200);
    // The OpenAPI document is 3.1 and generated from the types: the schemas it names are there.
    let doc = s.get("/openapi.json").json();
    assert_eq!(doc["openapi"], "3.1.0");
    for p in [
        "/v1/run",
        "/v1/run/batch",
        "/run_code",
        "/v1/sandboxes",
        "/v1/sandboxes/{id}/exec",
        "/v1/sandboxes/{id}/files/{path}",
    ] {
        assert!(doc["paths"][p].is_object(), "{p} missing");
    }
    let schemas = &doc["components"]["schemas"];
    assert!(
        schemas["RunRequest"]["properties"]["limits"].is_object(),
        "{schemas}"
    );
    assert!(schemas["RunCodeRequest"]["properties"]["memory_limit_MB"].is_object());
    let text = doc.to_string();
    assert!(
        !text.contains("#/$defs/"),
        "every reference points into components"
    );
    let langs = s.get("/v1/languages").json();
    let names: Vec<&str> = langs
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"python") && names.contains(&"cpp") && names.contains(&"bash"),
        "{names:?}"
    );

    // A command, directly.
    let r = s.post("/v1/run", &json!({"command": ["sh", "-c", "read x; echo out $x; echo err >&2; exit 3"], "stdin": "in"}));
    assert_eq!(r.status, 200);
    let j = r.json();
    assert_eq!(
        (j["status"].as_str(), j["exit_code"].as_i64()),
        (Some("exit"), Some(3)),
        "{j}"
    );
    assert_eq!(
        (j["stdout"]["data"].as_str(), j["stderr"]["data"].as_str()),
        (Some("out in\n"), Some("err\n"))
    );
    assert_eq!(j["report"]["status"], "exit");
    assert!(j["report"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l["name"] == "seccomp" && l["enforced"] == true));
    // Code with files in and out, through the agent; binary content in base64.
    let r = s.post(
        "/v1/run",
        &json!({"language": "python", "code": "import sys\nd=open('data/in.bin','rb').read()\nopen('out.bin','wb').write(d[::-1])\nprint(sys.stdin.read().upper())",
                "stdin": {"base64": "aGVsbG8="}, "files": {"data/in.bin": {"base64": "AP8B"}}, "fetch": ["out.bin", "missing.txt"], "env": {"X": "1"}}),
    );
    let j = r.json();
    assert_eq!(j["status"], "ok", "{j}");
    assert_eq!(j["stdout"]["data"], "HELLO\n");
    assert_eq!(
        j["files"]["out.bin"],
        json!({"data": "Af8A", "encoding": "base64", "bytes": 3, "truncated": false})
    );
    assert_eq!(j["file_errors"]["missing.txt"], "not-found");
    // A compiled language: a compile stage, then the program.
    let j = s.post("/v1/run", &json!({"language": "cpp", "code": "#include <cstdio>\nint main(){int a,b;scanf(\"%d %d\",&a,&b);printf(\"%d\\n\",a+b);}", "stdin": "2 40"})).json();
    assert_ok_with(&j, "42\n");
    assert_eq!(j["compile"]["status"], "ok");
    let j = s
        .post("/v1/run", &json!({"language": "c", "code": "int main( {"}))
        .json();
    assert_eq!(
        (j["status"].as_str(), j["compile"]["status"].as_str()),
        (Some("exit"), Some("exit")),
        "{j}"
    );
    assert!(
        j["compile"]["stderr"]["data"]
            .as_str()
            .unwrap()
            .contains("error"),
        "{j}"
    );
    // Each limit's status, from one vocabulary.
    let j = s
        .post(
            "/v1/run",
            &json!({"command": ["sleep", "30"], "limits": {"timeout_ms": 300}}),
        )
        .json();
    assert_eq!(j["status"], "timeout", "{j}");
    let j = s.post("/v1/run", &json!({"language": "python", "code": "import time\ntime.sleep(30)", "limits": {"timeout_ms": 300}})).json();
    assert_eq!(j["status"], "timeout", "{j}");
    let j = s
        .post(
            "/v1/run",
            &json!({"command": ["yes"], "limits": {"output_bytes": 1000}}),
        )
        .json();
    assert_eq!(
        (j["status"].as_str(), j["stdout"]["truncated"].as_bool()),
        (Some("output-limit"), Some(true)),
        "{j}"
    );
    let j = s
        .post(
            "/v1/run",
            &json!({"language": "bash", "code": "yes", "limits": {"output_bytes": 1000}}),
        )
        .json();
    assert_eq!(
        (j["status"].as_str(), j["stdout"]["bytes"].as_u64()),
        (Some("output-limit"), Some(1000)),
        "{j}"
    );
    let j = s.post("/v1/run", &json!({"language": "python", "code": "x = bytearray(400 << 20)\nx[::4096] = b'x' * len(x[::4096])\n", "limits": {"memory_bytes": 64 << 20}})).json();
    assert_eq!(j["status"], "oom", "{j}");
    let j = s
        .post(
            "/v1/run",
            &json!({"command": ["sh", "-c", "kill -SEGV $$"]}),
        )
        .json();
    assert_eq!(
        (j["status"].as_str(), j["signal"].as_i64()),
        (Some("signal"), Some(11)),
        "{j}"
    );
    let j = s
        .post("/v1/run", &json!({"command": ["no-such-program"]}))
        .json();
    assert_eq!(
        j["status"], "sandbox-error",
        "a program that cannot start is never the program's result: {j}"
    );
    let j = s.post("/v1/run", &json!({"language": "python", "code": "while True: pass", "limits": {"cpu_time_ms": 300}})).json();
    assert_eq!(j["status"], "cpu-timeout", "{j}");

    // A batch: NDJSON lines in order of completion, every index once.
    let r = s.post(
        "/v1/run/batch",
        &json!({"runs": [
        {"command": ["sh", "-c", "sleep 0.5; echo slow"]},
        {"command": ["echo", "fast"]},
        {"language": "python", "code": "print(6*7)"},
        {"command": ["false"]}], "concurrency": 4}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    let mut lines = r.lines();
    assert_eq!(lines.len(), 4, "{lines:?}");
    lines.sort_by_key(|l| l["index"].as_u64());
    let outs: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| {
            (
                l["result"]["status"].as_str().unwrap(),
                l["result"]["stdout"]["data"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        outs,
        vec![
            ("ok", "slow\n"),
            ("ok", "fast\n"),
            ("ok", "42\n"),
            ("exit", "")
        ]
    );

    // SandboxFusion's shape.
    let j = s.post("/run_code", &json!({"code": "print(input())", "language": "python", "stdin": "7", "run_timeout": 5, "files": {"a.txt": "aGk="}, "fetch_files": ["a.txt"]})).json();
    assert_eq!(
        (j["status"].as_str(), j["message"].as_str()),
        (Some("Success"), Some("")),
        "{j}"
    );
    assert_eq!(j["run_result"]["status"], "Finished");
    assert_eq!(
        (
            j["run_result"]["return_code"].as_i64(),
            j["run_result"]["stdout"].as_str()
        ),
        (Some(0), Some("7\n"))
    );
    assert_eq!(j["files"]["a.txt"], "aGk=");
    assert!(j["compile_result"].is_null());
    // palisade's own part: its status, error and files not read back, and the whole report.
    let own = &j["palisade"];
    assert_eq!(own["status"], "ok", "{j}");
    assert!(
        own["error"].is_null() && own["file_errors"] == json!({}),
        "{j}"
    );
    assert_eq!(own["report"]["status"], "ok", "{j}");
    assert!(own["report"]["engine"].is_string(), "{j}");
    let j = s.post("/run_code", &json!({"code": "import time; time.sleep(5)", "language": "python", "run_timeout": 0.3})).json();
    assert_eq!(
        (j["status"].as_str(), j["run_result"]["status"].as_str()),
        (Some("Failed"), Some("TimeLimitExceeded")),
        "{j}"
    );
    let j = s
        .post(
            "/run_code",
            &json!({"code": "int main(){return 1", "language": "cpp"}),
        )
        .json();
    assert_eq!(
        (j["status"].as_str(), j["compile_result"]["status"].as_str()),
        (Some("Failed"), Some("Finished")),
        "{j}"
    );
    assert!(
        j["run_result"].is_null() && j["compile_result"]["return_code"].as_i64() != Some(0),
        "{j}"
    );

    let m = String::from_utf8(s.get("/metrics").body).unwrap();
    for needle in [
        "palisade_runs_total{status=\"ok\",engine=\"template\"}",
        "palisade_runs_total{status=\"oom\",engine=\"template\"} 1",
        "palisade_run_seconds_bucket",
        "palisade_queue_depth 0",
        "palisade_sessions 0",
        "palisade_denied_egress_total",
        "palisade_oom_kills_total",
    ] {
        assert!(m.contains(needle), "{needle} not in {m}");
    }
    assert_nothing_held(s.pid());
}

#[test]
fn bad_input_is_a_4xx_naming_the_field_and_starts_nothing() {
    let policy =
        "[limits]\nmemory = \"256MiB\"\ntimeout = \"20s\"\n[network]\nallow = [\"pypi.org\"]\n";
    let s = Server::start(policy, &["--max-body", "64KiB"]);
    let pid = s.pid();
    // (what, body, status, code, field)
    type Case<'a> = (&'a str, Vec<u8>, u16, &'a str, Option<&'a str>);
    let cases: Vec<Case> = vec![
        (
            "malformed JSON",
            b"{\"command\": [".to_vec(),
            400,
            "invalid-json",
            None,
        ),
        ("not an object", b"[1]".to_vec(), 400, "invalid-json", None),
        (
            "unknown field",
            br#"{"command":["true"],"memroy":1}"#.to_vec(),
            400,
            "unknown-field",
            None,
        ),
        (
            "unknown nested field",
            br#"{"command":["true"],"limits":{"memory":1}}"#.to_vec(),
            400,
            "unknown-field",
            Some("limits.memory"),
        ),
        (
            "wrong type",
            br#"{"command":["true"],"limits":{"memory_bytes":"lots"}}"#.to_vec(),
            400,
            "invalid-json",
            Some("limits.memory_bytes"),
        ),
        (
            "unknown language",
            br#"{"language":"cobol","code":"x"}"#.to_vec(),
            400,
            "unknown-language",
            Some("language"),
        ),
        (
            "memory over the ceiling",
            br#"{"command":["true"],"limits":{"memory_bytes":1073741824}}"#.to_vec(),
            403,
            "ceiling",
            Some("limits.memory_bytes"),
        ),
        (
            "timeout over the ceiling",
            br#"{"command":["true"],"limits":{"timeout_ms":60000}}"#.to_vec(),
            403,
            "ceiling",
            Some("limits.timeout_ms"),
        ),
        (
            "compile timeout over the ceiling",
            br#"{"language":"c","code":"int main(){}","compile":{"timeout_ms":60000}}"#.to_vec(),
            403,
            "ceiling",
            Some("compile.timeout_ms"),
        ),
        (
            "allow rule not permitted",
            br#"{"command":["true"],"allow_net":["example.com"]}"#.to_vec(),
            403,
            "not-allowed",
            Some("allow_net[0]"),
        ),
        (
            "a wildcard allow rule",
            br#"{"command":["true"],"allow_net":["*"]}"#.to_vec(),
            400,
            "invalid",
            Some("allow_net[0]"),
        ),
        (
            "a file path with ..",
            br#"{"command":["true"],"files":{"../x":"a"}}"#.to_vec(),
            400,
            "invalid",
            Some("files[\"../x\"]"),
        ),
        (
            "an absolute file path",
            br#"{"command":["true"],"files":{"/etc/passwd":"a"}}"#.to_vec(),
            400,
            "invalid",
            Some("files[\"/etc/passwd\"]"),
        ),
        (
            "a fetch path with ..",
            br#"{"command":["true"],"fetch":["a/../../b"]}"#.to_vec(),
            400,
            "invalid",
            Some("fetch[0]"),
        ),
        (
            "bad base64",
            br#"{"command":["true"],"stdin":{"base64":"@@"}}"#.to_vec(),
            400,
            "invalid",
            Some("stdin"),
        ),
        (
            "a bad variable name",
            br#"{"command":["true"],"env":{"1X":"a"}}"#.to_vec(),
            400,
            "invalid",
            Some("env.1X"),
        ),
        (
            "too few processes for the agent",
            br#"{"language":"python","code":"","fetch":["out.txt"],"limits":{"pids":2}}"#.to_vec(),
            400,
            "invalid",
            Some("limits.pids"),
        ),
        (
            "too few processes to run at all",
            br#"{"command":["true"],"limits":{"pids":1}}"#.to_vec(),
            400,
            "invalid",
            Some("limits.pids"),
        ),
        (
            "no command",
            br#"{}"#.to_vec(),
            400,
            "invalid",
            Some("command"),
        ),
        (
            "a body over the limit",
            format!(
                "{{\"command\":[\"true\"],\"stdin\":\"{}\"}}",
                "x".repeat(70_000)
            )
            .into_bytes(),
            413,
            "too-large",
            None,
        ),
    ];
    for (what, body, status, code, field) in &cases {
        let r = s.req("POST", "/v1/run", body);
        assert_eq!(
            r.status,
            *status,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let e = &r.json()["error"];
        assert_eq!(e["code"], *code, "{what}: {e}");
        if let Some(f) = field {
            assert_eq!(e["field"], *f, "{what}: {e}");
        }
        assert!(!e["message"].as_str().unwrap().is_empty());
        if *status == 403 {
            assert_eq!(r.json()["status"], "policy-denied", "{what}");
            assert!(
                e["accepted"].as_str().is_some(),
                "{what}: the accepted values are named: {e}"
            );
        }
    }
    // The ceiling's own values are named.
    let e = s
        .post(
            "/v1/run",
            &json!({"command": ["true"], "limits": {"memory_bytes": 1u64 << 30}}),
        )
        .json();
    assert!(
        e["error"]["accepted"]
            .as_str()
            .unwrap()
            .contains(&(256u64 << 20).to_string()),
        "{e}"
    );
    let e = s
        .post(
            "/v1/run",
            &json!({"command": ["true"], "allow_net": ["example.com"]}),
        )
        .json();
    assert!(
        e["error"]["accepted"]
            .as_str()
            .unwrap()
            .contains("pypi.org"),
        "{e}"
    );
    // Batches name the run; SandboxFusion's endpoint names its own fields.
    let r = s.post("/v1/run/batch", &json!({"runs": [{"command": ["true"]}, {"command": ["true"], "limits": {"pids": 1u64 << 40}}]}));
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (403, Some("runs[1].limits.pids"))
    );
    let r = s.post(
        "/run_code",
        &json!({"code": "", "language": "python", "memory_limit_MB": 4096}),
    );
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (403, Some("limits.memory_bytes"))
    );
    let r = s.post("/run_code", &json!({"code": "", "language": "brainfuck"}));
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (400, Some("unknown-language"))
    );
    // Unknown sessions, execs, endpoints.
    let r = s.get("/v1/sandboxes/sb-nope");
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (404, Some("not-found"))
    );
    let r = s.post("/v1/sandboxes/sb-nope/exec", &json!({"command": ["true"]}));
    assert_eq!(r.status, 404);
    assert_eq!(s.get("/v2/nothing").status, 404);
    // A path or a query the router cannot decode is JSON naming the field too (it was axum's
    // plain text): a segment that is not UTF-8, a parameter given twice.
    for (url, field) in [
        ("/v1/sandboxes/%ff", "path"),
        ("/v1/sandboxes/sb-nope/exec/%ff", "path"),
        ("/v1/sandboxes/sb-nope/files?path=a&path=b", "query"),
    ] {
        let r = s.get(url);
        assert_eq!(
            (r.status, r.json()["error"]["field"].as_str()),
            (400, Some(field)),
            "{url}"
        );
    }
    // Found by schemathesis: these were 500s (the sandbox could not even start its agent).
    let r = s.post("/v1/sandboxes", &json!({"limits": {"open_files": 1}}));
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (400, Some("limits.open_files"))
    );
    let r = s.post(
        "/v1/run",
        &json!({"command": ["true"], "limits": {"open_files": 3}}),
    );
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (400, Some("limits.open_files"))
    );
    let r = s.post("/v1/sandboxes", &json!({"limits": {"pids": 1}}));
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (400, Some("limits.pids"))
    );
    let r = s.post("/v1/sandboxes", &json!({"ttl_s": 1_000_000}));
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (403, Some("ttl_s"))
    );
    // Nothing ran for any of them.
    assert_eq!(
        s.metric("palisade_runs_total{status=\"ok\",engine=\"template\"}"),
        0
    );
    assert_eq!(
        s.metric("palisade_runs_total{status=\"ok\",engine=\"exec\"}"),
        0
    );
    assert_nothing_held(pid);
}

#[test]
fn a_token_is_required_when_given_and_off_loopback() {
    let dir = TempDir::new("serve-token");
    let out = Command::new(palisade_bin())
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--token-file") && err.contains("loopback"),
        "{err}"
    );
    std::fs::write(dir.path().join("token"), "0123456789abcdef-token\n").unwrap();
    let mut s = {
        std::fs::write(dir.path().join("p.toml"), "").unwrap();
        let sock = dir.path().join("t.sock");
        let child = serve_on(&sock)
            .arg("--token-file")
            .arg(dir.path().join("token"))
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_until("the socket", || sock.exists());
        (Reap(child), sock)
    };
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&s.1).unwrap().permissions().mode() & 0o777,
        0o600,
        "only the server's user may connect"
    );
    let r = request(&s.1, "POST", "/v1/run", &[], br#"{"command":["true"]}"#);
    assert_eq!(
        (r.status, r.header("www-authenticate")),
        (401, Some("Bearer"))
    );
    let r = request(
        &s.1,
        "POST",
        "/v1/run",
        &[("Authorization", "Bearer wrong-token-of-some-length")],
        br#"{"command":["true"]}"#,
    );
    assert_eq!(r.status, 401);
    let r = request(
        &s.1,
        "POST",
        "/v1/run",
        &[("Authorization", "Bearer 0123456789abcdef-token")],
        br#"{"command":["true"]}"#,
    );
    assert_eq!((r.status, r.json()["status"].as_str()), (200, Some("ok")));
    assert_eq!(
        request(&s.1, "GET", "/healthz", &[], b"").status,
        200,
        "health checks need no token"
    );
    assert_eq!(s.0.terminate().code(), Some(0));
    assert!(!s.1.exists(), "the socket is removed at exit");
}

/// A socket left by a server that died is replaced; anything else at the path is not.
#[test]
fn a_stale_socket_is_replaced_and_nothing_else_is() {
    let dir = TempDir::new("serve-stale");
    let sock = dir.path().join("s.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let mut child = Reap(serve_on(&sock).stderr(Stdio::null()).spawn().unwrap());
    wait_until("the server answers", || {
        UnixStream::connect(&sock).is_ok()
            && request(&sock, "GET", "/healthz", &[], b"").status == 200
    });
    // A second server on a live socket is refused.
    let out = serve_on(&sock).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not replaced"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(child.terminate().code(), Some(0));
    // A regular file is never removed.
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "keep me").unwrap();
    let out = serve_on(&file).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

#[test]
fn a_session_survives_many_execs_and_dies_at_its_ttl() {
    let s = Server::start(POLICY, &[]);
    let info = s.post("/v1/sandboxes", &json!({"ttl_s": 4, "labels": {"who": "test"}, "idempotency_key": "k1", "env": {"GREETING": "hi"}}));
    assert_eq!(info.status, 201, "{:?}", info);
    let info = info.json();
    let id = info["id"].as_str().unwrap().to_owned();
    assert_eq!(info["labels"]["who"], "test");
    // The same idempotency key gives the same session.
    assert_eq!(
        s.post("/v1/sandboxes", &json!({"idempotency_key": "k1"}))
            .json()["id"],
        id.as_str()
    );
    // Many execs share the session's filesystem and processes' ceilings.
    for i in 0..30 {
        let j = s
            .post(
                &format!("/v1/sandboxes/{id}/exec"),
                &json!({"command": ["sh", "-c", "echo $GREETING >> log; wc -l < log"]}),
            )
            .json();
        assert_eq!(j["status"], "ok", "{j}");
        assert_eq!(
            j["stdout"]["data"].as_str().unwrap().trim(),
            (i + 1).to_string()
        );
    }
    // Files: put, list, get, remove.
    assert_eq!(
        s.req(
            "PUT",
            &format!("/v1/sandboxes/{id}/files/d/e/f.txt"),
            b"content"
        )
        .status,
        204
    );
    let l = s.get(&format!("/v1/sandboxes/{id}/files?path=d/e")).json();
    assert_eq!(
        l["entries"],
        json!([{"name": "f.txt", "kind": "file", "size": 7}])
    );
    assert_eq!(
        s.get(&format!("/v1/sandboxes/{id}/files/d/e/f.txt")).body,
        b"content"
    );
    assert_eq!(
        s.req(
            "DELETE",
            &format!("/v1/sandboxes/{id}/files/d?recursive=true"),
            b""
        )
        .status,
        204
    );
    assert_eq!(
        s.get(&format!("/v1/sandboxes/{id}/files/d/e/f.txt")).status,
        404
    );
    // Streamed as NDJSON and as server-sent events.
    let r = s.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({"command": ["sh", "-c", "echo one; echo two >&2"], "mode": "stream"}),
    );
    let ev: Vec<String> = r
        .lines()
        .iter()
        .map(|l| l["event"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ev.first().map(String::as_str), Some("start"));
    assert_eq!(ev.last().map(String::as_str), Some("exit"));
    assert!(
        ev.contains(&"stdout".into()) && ev.contains(&"stderr".into()),
        "{ev:?}"
    );
    let r = request(
        &s.sock,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        &[("Accept", "text/event-stream")],
        br#"{"command":["echo","sse"]}"#,
    );
    let text = String::from_utf8(r.body).unwrap();
    assert!(
        text.contains("event: stdout\ndata: ") && text.contains("event: exit\n"),
        "{text}"
    );
    // In the background: poll, feed stdin, signal.
    let b = s.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({"command": ["sh", "-c", "cat; echo done"], "mode": "background"}),
    );
    assert_eq!(b.status, 202);
    let e = b.json()["id"].as_u64().unwrap();
    assert_eq!(
        s.get(&format!("/v1/sandboxes/{id}/exec/{e}")).json()["running"],
        true
    );
    assert_eq!(
        s.req(
            "POST",
            &format!("/v1/sandboxes/{id}/exec/{e}/stdin"),
            b"fed "
        )
        .status,
        204
    );
    assert_eq!(
        s.req(
            "POST",
            &format!("/v1/sandboxes/{id}/exec/{e}/stdin?close=true"),
            b"input"
        )
        .status,
        204
    );
    wait_until("the background exec ends", || {
        s.get(&format!("/v1/sandboxes/{id}/exec/{e}")).json()["running"] == false
    });
    let j = s.get(&format!("/v1/sandboxes/{id}/exec/{e}")).json();
    assert_eq!(j["result"]["stdout"]["data"], "fed inputdone\n", "{j}");
    let b = s
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": ["sleep", "60"], "mode": "background"}),
        )
        .json();
    let e = b["id"].as_u64().unwrap();
    assert_eq!(
        s.post(
            &format!("/v1/sandboxes/{id}/exec/{e}/signal"),
            &json!({"signal": "TERM"})
        )
        .status,
        204
    );
    wait_until("the signalled exec ends", || {
        s.get(&format!("/v1/sandboxes/{id}/exec/{e}")).json()["running"] == false
    });
    assert_eq!(
        s.get(&format!("/v1/sandboxes/{id}/exec/{e}")).json()["result"]["signal"],
        15
    );
    // A program that is not there: 400 naming the command (found by schemathesis: it was a 500).
    let r = s.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({"command": ["no-such-program"]}),
    );
    assert_eq!(
        (
            r.status,
            r.json()["error"]["code"].as_str(),
            r.json()["error"]["field"].as_str()
        ),
        (400, Some("exec"), Some("command"))
    );
    // A per-exec deadline kills the exec, not the session.
    let j = s
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": ["sleep", "60"], "timeout_ms": 200}),
        )
        .json();
    assert_eq!(j["status"], "timeout");
    assert_eq!(
        s.post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": ["true"]})
        )
        .json()["status"],
        "ok"
    );
    // At its TTL it is destroyed with everything in it; calls then get 410.
    wait_until("the TTL passes", || {
        s.get(&format!("/v1/sandboxes/{id}")).status == 410
    });
    let r = s.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({"command": ["true"]}),
    );
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (410, Some("gone"))
    );
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("TTL"));
    assert_eq!(s.metric("palisade_sessions"), 0);
    assert_nothing_held(s.pid());
    // Idle past its idle timeout: destroyed too, and the reason says so.
    let id = s
        .post("/v1/sandboxes", &json!({"ttl_s": 600, "idle_timeout_s": 1}))
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_until("the idle timeout passes", || {
        s.get(&format!("/v1/sandboxes/{id}")).status == 410
    });
    let r = s.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({"command": ["true"]}),
    );
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("idle"),
        "{:?}",
        r.json()
    );
    assert!(s.metric("palisade_sessions_expired_total") >= 2);
    // Deleted explicitly: its report comes back, and it is gone.
    let id = s.post("/v1/sandboxes", &json!({})).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let d = s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"");
    assert_eq!(d.status, 200);
    assert!(d.json()["report"]["layers"].is_array());
    assert_eq!(s.get(&format!("/v1/sandboxes/{id}")).status, 410);
    assert_nothing_held(s.pid());
}

#[test]
fn file_transfers_cannot_leave_the_sandbox() {
    let s = Server::start(POLICY, &["--max-fetch", "1MiB"]);
    // A host file the code must not reach through the server.
    let host = TempDir::new("serve-host");
    let secret = host.path().join("secret");
    std::fs::write(&secret, "host secret").unwrap();
    let id = s.post("/v1/sandboxes", &json!({})).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let plant = format!(
        "ln -s {0} host-link; ln -s /etc/passwd passwd-link; ln -s / root-link; ln -s {1} dir-link; mkfifo fifo; head -c 2000000 /dev/zero > huge; mkdir d; echo inside > d/ok",
        secret.display(),
        host.path().display()
    );
    let j = s
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": ["sh", "-c", plant]}),
        )
        .json();
    assert_eq!(j["status"], "ok", "{j}");
    for (path, code) in [
        ("host-link", "symlink"),
        ("passwd-link", "symlink"),
        ("root-link/etc/passwd", "symlink"),
        ("dir-link/secret", "symlink"),
        ("fifo", "not-regular"),
        ("d", "not-regular"),
    ] {
        let r = s.get(&format!("/v1/sandboxes/{id}/files/{path}"));
        assert!(
            r.status >= 400 && r.status < 500,
            "GET {path}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["error"]["value"], code, "GET {path}");
    }
    // A session's file streams out in pieces: one over --max-fetch comes whole.
    let r = s.get(&format!("/v1/sandboxes/{id}/files/huge"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.body.len() == 2_000_000 && r.body.iter().all(|b| *b == 0),
        "{} bytes",
        r.body.len()
    );
    for (path, code) in [
        ("host-link", "symlink"),
        ("passwd-link", "symlink"),
        ("root-link/tmp/x", "symlink"),
        ("dir-link/secret", "symlink"),
        ("fifo", "not-regular"),
    ] {
        let r = s.req(
            "PUT",
            &format!("/v1/sandboxes/{id}/files/{path}"),
            b"overwritten",
        );
        assert!(
            r.status >= 400 && r.status < 500,
            "PUT {path}: {}",
            r.status
        );
        assert_eq!(r.json()["error"]["value"], code, "PUT {path}");
    }
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "host secret",
        "the host file is untouched"
    );
    // `..` and absolute paths never reach the agent (the URL's own `..` is normalized away by
    // nothing here: it is refused).
    for p in ["../x", "a/../../x", "./x"] {
        let r = s.get(&format!("/v1/sandboxes/{id}/files/{p}"));
        assert_eq!(r.status, 400, "{p}");
    }
    assert_eq!(
        s.get(&format!("/v1/sandboxes/{id}/files//etc/passwd"))
            .status,
        400
    );
    // Archives: what comes out holds regular files and directories only (links skipped, never
    // followed); what goes in must be files and directories with relative names, checked whole.
    // With the huge file, over --max-fetch, it is refused by default (its size is the
    // sandbox's to choose, the client's to accept), and streams when the client says it takes
    // more; links and the fifo are counted in its trailer.
    let r = s.get(&format!("/v1/sandboxes/{id}/archive"));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["value"], "too-large");
    let mut c = send(
        &s.sock,
        "GET",
        &format!("/v1/sandboxes/{id}/archive?max_bytes=10000000"),
        &[("TE", "trailers")],
        b"",
    );
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    let (head, body, trailers, ended) = chunked_answer(&raw);
    assert!(ended && head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(
        trailers,
        vec![("x-palisade-skipped".to_owned(), "5".to_owned())]
    );
    let huge = tar_entries(&body)
        .into_iter()
        .find(|(n, _)| n == "huge")
        .expect("the huge file");
    assert!(huge.1 == vec![0u8; 2_000_000], "{} bytes", huge.1.len());
    assert_eq!(
        s.req("DELETE", &format!("/v1/sandboxes/{id}/files/huge"), b"")
            .status,
        204
    );
    let r = s.get(&format!("/v1/sandboxes/{id}/archive"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.header("x-palisade-skipped"),
        Some("5"),
        "four links and a fifo"
    );
    let mut names: Vec<String> = tar::Archive::new(&r.body[..])
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    names.sort();
    assert_eq!(names, vec!["d/", "d/ok"]);
    let mut good = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(5);
    h.set_mode(0o755);
    good.append_data(&mut h, "x/y/run.sh", &b"hello"[..])
        .unwrap();
    let good = good.into_inner().unwrap();
    assert_eq!(
        s.req("PUT", &format!("/v1/sandboxes/{id}/archive?path=up"), &good)
            .status,
        204
    );
    assert_eq!(
        s.get(&format!("/v1/sandboxes/{id}/files/up/x/y/run.sh"))
            .body,
        b"hello"
    );
    let evil = |name: &[u8], kind: tar::EntryType, link: Option<&str>| {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_entry_type(kind);
        h.set_size(if kind == tar::EntryType::Regular {
            1
        } else {
            0
        });
        h.set_mode(0o644);
        if let Some(l) = link {
            h.set_link_name(l).unwrap();
        }
        h.set_cksum();
        let mut v = h.as_bytes().to_vec();
        if kind == tar::EntryType::Regular {
            v.extend_from_slice(b"x");
            v.resize(1024, 0);
        }
        // A first, harmless entry, which must not be written either: the archive is checked whole.
        let mut first = tar::Builder::new(Vec::new());
        let mut fh = tar::Header::new_gnu();
        fh.set_size(1);
        first
            .append_data(&mut fh, "first-entry", &b"1"[..])
            .unwrap();
        let mut out = first.into_inner().unwrap();
        out.truncate(out.len() - 1024); // drop its end-of-archive blocks
        out.extend_from_slice(&v);
        out.extend_from_slice(&[0u8; 1024]);
        out
    };
    for (what, tar) in [
        (
            "a `..` entry",
            evil(b"../escape", tar::EntryType::Regular, None),
        ),
        (
            "an absolute entry",
            evil(b"/etc/cron.d/x", tar::EntryType::Regular, None),
        ),
        (
            "a symlink entry",
            evil(
                b"link",
                tar::EntryType::Symlink,
                Some(&secret.display().to_string()),
            ),
        ),
        (
            "a hard link entry",
            evil(b"hard", tar::EntryType::Link, Some("/etc/passwd")),
        ),
        ("a device", evil(b"dev", tar::EntryType::Char, None)),
    ] {
        let r = s.req("PUT", &format!("/v1/sandboxes/{id}/archive"), &tar);
        assert_eq!(
            r.status,
            400,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["error"]["value"], "invalid", "{what}");
    }
    assert_eq!(
        s.get(&format!("/v1/sandboxes/{id}/files/first-entry"))
            .status,
        404,
        "nothing of a refused archive is written"
    );
    // A directory and a file of one name, or an entry under a file: refused whole before
    // anything is written (unpacking had stopped half-way, the directory made).
    for names in [["confl/", "confl"], ["under", "under/x"]] {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        let (d, f) = if names[0].ends_with('/') {
            (names[0], names[1])
        } else {
            (names[1], names[0])
        };
        if d.ends_with('/') {
            b.append_data(&mut h, d, &b""[..]).unwrap();
        }
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(1);
        b.append_data(&mut h, f, &b"1"[..]).unwrap();
        if !d.ends_with('/') {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_size(1);
            b.append_data(&mut h, d, &b"1"[..]).unwrap();
        }
        let r = s.req(
            "PUT",
            &format!("/v1/sandboxes/{id}/archive"),
            &b.into_inner().unwrap(),
        );
        assert_eq!(
            (r.status, r.json()["error"]["value"].as_str()),
            (400, Some("invalid")),
            "{names:?}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let top = names[0].trim_end_matches('/');
        let l = s.get(&format!("/v1/sandboxes/{id}/files?path=")).json();
        assert!(
            !l.to_string().contains(&format!("\"{top}\"")),
            "{names:?}: written in part: {l}"
        );
    }
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "host secret");
    // One budget for all the files a run fetches: --max-fetch in all, not per file.
    let j = s
        .post(
            "/v1/run",
            &json!({"language": "bash", "code": "head -c 700000 /dev/zero > a; head -c 700000 /dev/zero > b", "fetch": ["a", "b"]}),
        )
        .json();
    assert_eq!(j["files"]["a"]["bytes"], 700000, "{}", j["file_errors"]);
    assert_eq!(j["file_errors"]["b"], "too-large");
    // One-shot fetches refuse the same way, and the run's own files still come back.
    let j = s
        .post("/v1/run", &json!({"command": ["true"], "fetch": ["x"]}))
        .json();
    assert_eq!(j["file_errors"]["x"], "not-found");
    let j = s
        .post(
            "/v1/run",
            &json!({"language": "bash", "code": format!("ln -s {} l; mkfifo f; echo ok > good", secret.display()), "fetch": ["l", "f", "good"]}),
        )
        .json();
    assert_eq!(
        j["file_errors"],
        json!({"l": "symlink", "f": "not-regular"}),
        "{j}"
    );
    assert_eq!(j["files"]["good"]["data"], "ok\n");
    // The session still works after all that.
    assert_eq!(
        s.get(&format!("/v1/sandboxes/{id}/files/d/ok")).body,
        b"inside\n"
    );
    assert_eq!(
        s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"").status,
        200
    );
    assert_nothing_held(s.pid());
}

/// A policy file with a `[bounds]` table: its values are the defaults, the bounds the ceiling.
#[test]
fn a_bounds_table_gives_defaults_and_a_ceiling_apart() {
    let policy = "[limits]\nmemory = \"128MiB\"\n[network]\n[bounds.limits]\nmemory = \"512MiB\"\n[bounds.network]\nallow = [\"*.pythonhosted.org\"]\n";
    let s = Server::start(policy, &[]);
    let j = s.post("/v1/run", &json!({"command": ["true"]})).json();
    assert_eq!(j["report"]["limits"]["memory_bytes"], 128u64 << 20, "{j}");
    let j = s.post("/v1/run", &json!({"command": ["true"], "limits": {"memory_bytes": 256u64 << 20}, "allow_net": ["files.pythonhosted.org"]})).json();
    assert_eq!(
        (
            j["status"].as_str(),
            j["report"]["limits"]["memory_bytes"].as_u64()
        ),
        (Some("ok"), Some(256 << 20)),
        "{j}"
    );
    assert_eq!(j["report"]["network"]["mode"], "allow-list");
    let r = s.post(
        "/v1/run",
        &json!({"command": ["true"], "limits": {"memory_bytes": 1u64 << 30}}),
    );
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (403, Some("limits.memory_bytes"))
    );
    let r = s.post(
        "/v1/run",
        &json!({"command": ["true"], "allow_net": ["pypi.org"]}),
    );
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (403, Some("not-allowed"))
    );
    assert_nothing_held(s.pid());
}

/// Egress: a request may name only the server's allow rules; what the proxy denies is in the
/// run's report and counted in the metrics. (The denied name is never resolved or contacted: the
/// proxy refuses it by the rule.)
#[test]
fn egress_is_the_servers_rules_at_most_and_denials_are_counted() {
    let s = Server::start("[network]\nallow = [\"pypi.org\"]\n", &[]);
    let code = "import urllib.request\ntry:\n    urllib.request.urlopen('http://denied.example/', timeout=5)\nexcept Exception as e:\n    print('refused', type(e).__name__)\n";
    let j = s
        .post(
            "/v1/run",
            &json!({"language": "python", "code": code, "allow_net": ["pypi.org"]}),
        )
        .json();
    assert_eq!(j["status"], "ok", "{j}");
    assert!(
        j["stdout"]["data"].as_str().unwrap().starts_with("refused"),
        "{j}"
    );
    assert_eq!(j["report"]["network"]["mode"], "allow-list");
    assert!(
        j["report"]["network"]["denied"].as_u64().unwrap() >= 1,
        "{}",
        j["report"]["network"]
    );
    assert!(s.metric("palisade_denied_egress_total") >= 1);
    // Without allow_net the run has no network at all, whatever the server allows.
    let j = s
        .post("/v1/run", &json!({"language": "python", "code": code}))
        .json();
    assert_eq!(j["report"]["network"]["mode"], "none", "{j}");
    assert_nothing_held(s.pid());
}

/// Files to write, without files to fetch or a compile stage, need no agent: the sandbox's init
/// writes them before the program starts, so a run with two processes (init and the program) is
/// enough, and the program is the sandbox's payload. Text and base64 both arrive byte for byte.
#[test]
fn files_to_write_need_no_agent() {
    let s = Server::start(POLICY, &[]);
    let code = "import hashlib\nprint(open('data.txt').read(), hashlib.sha256(open('sub/b.bin', 'rb').read()).hexdigest())";
    let j = s
        .post(
            "/v1/run",
            &json!({
                "language": "python",
                "code": code,
                "files": {"data.txt": "hello", "sub/b.bin": {"base64": "AAH/gA=="}},
                "limits": {"pids": 2},
            }),
        )
        .json();
    assert_eq!(j["status"], "ok", "{j}");
    let digest = {
        let out = Command::new("python3")
            .args([
                "-c",
                "import hashlib; print(hashlib.sha256(bytes([0, 1, 255, 128])).hexdigest())",
            ])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(j["stdout"]["data"], format!("hello {digest}"), "{j}");
    assert_eq!(j["report"]["pids_peak"], 2, "{j}");
    // A path the request may not name is refused before anything starts, naming the field.
    let r = s.post(
        "/v1/run",
        &json!({"language": "python", "code": "print(1)", "files": {"../x": "y"}}),
    );
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.json()["error"]["field"]
            .as_str()
            .unwrap_or_default()
            .starts_with("files"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert_nothing_held(s.pid());
}

/// The warm pool: runs through the agent (files to fetch) with the default policy take a sandbox
/// started ahead (each used once, the pool refilled); runs that narrow the policy start their own;
/// the counters say which.
#[test]
fn the_warm_pool_serves_default_runs_once_each() {
    let s = Server::start(POLICY, &["--pool", "2"]);
    wait_until("the pool is full", || s.metric("palisade_pool_ready") == 2);
    assert_eq!(s.metric("palisade_pool_size"), 2);
    for i in 0..6 {
        let code = format!("import os\nprint({i}, os.path.exists('seen'))\nopen('seen', 'w')");
        let j = s
            .post(
                "/v1/run",
                &json!({"language": "python", "code": code, "fetch": ["seen"]}),
            )
            .json();
        assert_eq!(j["status"], "ok", "{j}");
        // Each run sees a fresh sandbox: nothing of an earlier run is there.
        assert_eq!(j["stdout"]["data"], format!("{i} False\n"), "{j}");
        wait_until("the pool refills", || s.metric("palisade_pool_ready") == 2);
    }
    assert_eq!(
        s.metric("palisade_pool_hits_total") + s.metric("palisade_pool_misses_total"),
        6
    );
    assert_eq!(
        s.metric("palisade_pool_hits_total"),
        6,
        "a full pool serves every run"
    );
    assert!(s.metric("palisade_pool_started_total") >= 8);
    // A run that narrows the policy, or names variables, starts its own sandbox.
    let before = s.metric("palisade_pool_hits_total") + s.metric("palisade_pool_misses_total");
    let j = s.post("/v1/run", &json!({"language": "python", "code": "print(1)", "fetch": ["main.py"], "limits": {"memory_bytes": 128u64 << 20}})).json();
    assert_eq!(
        (
            j["status"].as_str(),
            j["report"]["limits"]["memory_bytes"].as_u64()
        ),
        (Some("ok"), Some(128 << 20))
    );
    let j = s.post("/v1/run", &json!({"language": "python", "code": "import os; print(os.environ['K'])", "fetch": ["main.py"], "env": {"K": "v"}})).json();
    assert_eq!(j["stdout"]["data"], "v\n");
    assert_eq!(
        s.metric("palisade_pool_hits_total") + s.metric("palisade_pool_misses_total"),
        before
    );
    // A narrower deadline still uses the pool: the server keeps each stage's.
    let j = s.post("/v1/run", &json!({"language": "python", "code": "import time; time.sleep(30)", "fetch": ["main.py"], "limits": {"timeout_ms": 300}})).json();
    assert_eq!(j["status"], "timeout", "{j}");
    assert_eq!(
        s.metric("palisade_pool_hits_total") + s.metric("palisade_pool_misses_total"),
        before + 1
    );
}

/// 200 requests at once against 4 slots and 46 places in the queue: exactly 50 are admitted (they
/// wait at a gate the test holds shut), the other 150 get 429 with Retry-After; once the gate
/// opens, the 50 complete; nothing is left behind.
#[test]
fn a_full_queue_answers_429_and_the_accepted_complete() {
    let gate = TempDir::new("serve-gate");
    std::fs::set_permissions(
        gate.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let policy = format!(
        "[filesystem]\nro = [\"{}:/gate\"]\n[limits]\ntimeout = \"120s\"\n",
        gate.s()
    );
    let s = Server::start(&policy, &["--max-concurrency", "4", "--max-queue", "46"]);
    let sock = s.sock.clone();
    let results = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for _ in 0..200 {
        let (sock, results) = (sock.clone(), results.clone());
        threads.push(std::thread::spawn(move || {
            let body = json!({"command": ["sh", "-c", "while [ ! -e /gate/open ]; do sleep 0.05; done; echo through"]}).to_string();
            let r = request(&sock, "POST", "/v1/run", &[], body.as_bytes());
            results.lock().unwrap().push(r);
        }));
    }
    // Every request has been either answered or admitted.
    wait_until("all 200 requests are answered or admitted", || {
        let answered = results.lock().unwrap().len() as u64;
        answered + s.metric("palisade_running") + s.metric("palisade_queue_depth") == 200
    });
    {
        let r = results.lock().unwrap();
        assert_eq!(r.len(), 150, "exactly the requests past 50 are turned away");
        for x in r.iter() {
            assert_eq!(x.status, 429);
            assert_eq!(x.header("retry-after"), Some("1"));
            assert_eq!(x.json()["error"]["code"], "busy");
        }
    }
    assert_eq!(s.metric("palisade_running"), 4);
    assert_eq!(s.metric("palisade_queue_depth"), 46);
    std::fs::write(gate.path().join("open"), "").unwrap();
    for t in threads {
        t.join().unwrap();
    }
    let r = results.lock().unwrap();
    let ok: Vec<&Resp> = r.iter().filter(|x| x.status == 200).collect();
    assert_eq!(ok.len(), 50);
    for x in ok {
        let j = x.json();
        assert_eq!(
            (j["status"].as_str(), j["stdout"]["data"].as_str()),
            (Some("ok"), Some("through\n")),
            "{j}"
        );
    }
    assert_eq!(s.metric("palisade_rejected_busy_total"), 150);
    assert_nothing_held(s.pid());
}

/// SIGTERM while runs, a batch and a session are alive: the server stops taking work, kills what
/// is left after its grace, and exits 0 leaving no process, cgroup, temp dir or socket.
#[test]
fn sigterm_under_load_leaves_nothing() {
    let mut s = Server::start(
        POLICY,
        &[
            "--shutdown-grace",
            "1s",
            "--max-concurrency",
            "8",
            "--pool",
            "2",
        ],
    );
    let pid = s.pid();
    let marker = unique("sigterm");
    let cmd = json!({"command": ["sh", "-c", format!("sleep 60; : {marker}")]}).to_string();
    let mut threads = Vec::new();
    for _ in 0..6 {
        let (sock, body) = (s.sock.clone(), cmd.clone());
        threads.push(std::thread::spawn(move || {
            let mut st = send(&sock, "POST", "/v1/run", &[], body.as_bytes());
            let mut raw = Vec::new();
            let _ = st.read_to_end(&mut raw);
        }));
    }
    let id = s.post("/v1/sandboxes", &json!({})).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let bg =
        json!({"command": ["sh", "-c", format!("sleep 60; : {marker}")], "mode": "background"});
    assert_eq!(s.post(&format!("/v1/sandboxes/{id}/exec"), &bg).status, 202);
    wait_until("the runs are running", || {
        host_pids_with(&marker).len() >= 7
    });
    let sock = s.sock.clone();
    assert_eq!(s.stop(), 0, "a clean exit");
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        host_pids_with(&marker).is_empty(),
        "processes left: {:?}",
        host_pids_with(&marker)
    );
    let h = held(pid);
    assert!(
        h.cgroups.is_empty() && h.temp_dirs == 0,
        "left behind: {h:?}"
    );
    assert!(!sock.exists(), "the socket is removed");
}

/// A client that goes away takes its work with it: a plain run, a batch, a streamed exec. (The
/// programs sleep longer than `wait_until` waits, so work left running fails the test.)
#[test]
fn a_client_that_disconnects_kills_its_run() {
    // A deadline far beyond the waits below, so that only the disconnection can end the work.
    let s = Server::start("[limits]\ntimeout = \"10m\"\n", &[]);
    let marker = unique("gone");
    let body = json!({"command": ["sh", "-c", format!("sleep 300; : {marker}")]}).to_string();
    let c = send(&s.sock, "POST", "/v1/run", &[], body.as_bytes());
    // One shell per run carries the marker (its `sleep` does not).
    wait_until("the run is running", || host_pids_with(&marker).len() == 1);
    drop(c);
    wait_until("the run is killed", || host_pids_with(&marker).is_empty());
    let batch = json!({"runs": [{"command": ["sh", "-c", format!("sleep 300; : {marker}")]}, {"command": ["sh", "-c", format!("sleep 300; : {marker}")]}]}).to_string();
    let c = send(&s.sock, "POST", "/v1/run/batch", &[], batch.as_bytes());
    wait_until("the batch is running", || {
        host_pids_with(&marker).len() == 2
    });
    drop(c);
    wait_until("the batch is killed", || host_pids_with(&marker).is_empty());
    let id = s.post("/v1/sandboxes", &json!({})).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let ex = json!({"command": ["sh", "-c", format!("echo started; sleep 300; : {marker}")], "mode": "stream"}).to_string();
    let mut c = send(
        &s.sock,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        &[],
        ex.as_bytes(),
    );
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("started") {
        let n = c.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "the stream ended early: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    drop(c);
    wait_until("the exec is killed", || host_pids_with(&marker).is_empty());
    wait_until("the session knows", || {
        s.get(&format!("/v1/sandboxes/{id}")).json()["running"] == json!([])
    });
    assert_eq!(
        s.post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": ["true"]})
        )
        .json()["status"],
        "ok",
        "the session lives on"
    );
    assert_eq!(
        s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"").status,
        200
    );
    assert_nothing_held(s.pid());
}

/// veRL's own SandboxFusion client (`verl.utils.reward_score.sandbox_fusion.utils`, from PyPI,
/// installed by scripts/verl-venv.sh) against palisade serve on loopback TCP.
#[test]
fn verls_sandboxfusion_client_scores_through_run_code() {
    let python = ci_tool(
        "PALISADE_VERL_VENV",
        "/opt/palisade-ci/verl-venv",
        "bin/python",
        "scripts/verl-venv.sh",
    );
    let dir = TempDir::new("serve-verl");
    let mut child = Reap(
        Command::new(palisade_bin())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The address it took, from its first log line.
    let mut err = child.0.stderr.take().unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    let addr = loop {
        let n = err.read(&mut buf).unwrap();
        assert!(n > 0, "palisade serve exited: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        if let Some(i) = seen.find("listen=") {
            let rest = &seen[i + 7..];
            if let Some(end) = rest.find(char::is_whitespace) {
                break rest[..end].trim_matches('"').to_owned();
            }
        }
    };
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let script = dir.path().join("verl_client.py");
    std::fs::write(
        &script,
        r##"
import glob, importlib.util, json, sys
path = glob.glob(sys.prefix + "/lib/python3*/site-packages/verl/utils/reward_score/sandbox_fusion/utils.py")[0]
spec = importlib.util.spec_from_file_location("verl_sandbox_fusion_utils", path)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
url = sys.argv[1]
out = {}
code = "a, b = map(int, input().split())\nprint(a + b)\n"
out["python"] = m.check_correctness(url, {"inputs": ["1 2", "3 4"], "outputs": ["3", "8"]}, code, timeout=10, language="python")[0]
cpp = "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a*b<<std::endl;}\n"
out["cpp"] = m.check_correctness(url, {"inputs": ["6 7"], "outputs": ["42"]}, cpp, timeout=10, language="cpp")[0]
out["runtime_error"] = m.check_correctness(url, {"inputs": [""], "outputs": [""]}, "raise SystemExit(3)", timeout=10, language="python")[0]
out["timeout"] = m.check_correctness(url, {"inputs": [""], "outputs": [""]}, "while True: pass", timeout=1, language="python")[0]
out["compile_error"] = m.check_correctness(url, {"inputs": [""], "outputs": [""]}, "int main( {", timeout=10, language="cpp")[0]
resp, err = m.call_sandbox_api(url, "print('hi')", "", 10, 10, 1024, "python")
out["raw"] = [resp["status"], resp["run_result"]["status"], resp["run_result"]["stdout"], err]
print(json.dumps(out))
"##,
    )
    .unwrap();
    let out = Command::new(&python)
        .arg(&script)
        .arg(format!("http://{addr}/run_code"))
        .output()
        .unwrap();
    child.terminate();
    assert!(
        out.status.success(),
        "veRL's client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["python"], json!([true, false]), "{j}");
    assert_eq!(j["cpp"], json!([true]), "{j}");
    assert_eq!(j["runtime_error"], json!([-2]), "{j}");
    assert_eq!(j["timeout"], json!([-3]), "{j}");
    assert_eq!(j["compile_error"], json!([-4]), "{j}");
    assert_eq!(
        j["raw"],
        json!(["Success", "Finished", "hi\n", null]),
        "{j}"
    );
}

/// The code interpreter: a context keeps its variables from cell to cell; a cell answers its
/// output, its last value and its error (name, value, traceback); its bounds (cell size, output,
/// time, contexts) hold; an interpreter that is killed or exits loses its state and starts anew;
/// the cell's code stays inside the boundary (it cannot read the host's files).
#[test]
fn the_code_interpreter_keeps_state_and_bounds_what_it_spends() {
    let s = Server::start(POLICY, &[]);
    let id = s.post("/v1/sandboxes", &json!({})).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let cell = |body: Value| s.post(&format!("/v1/sandboxes/{id}/run_code"), &body);
    let j = cell(
        json!({"code": "import os\nx = 41\nprint('out')\nos.system('echo child >&2')\nx + 1"}),
    )
    .json();
    assert_eq!(j["status"], "ok", "{j}");
    assert_eq!(j["value"], "42");
    assert_eq!(j["stdout"]["data"], "out\n");
    assert_eq!(j["stderr"]["data"], "child\n");
    assert_eq!(j["context"], "default");
    assert_eq!(j["execution_count"], 1);
    assert_eq!(j["restarted"], true);
    let j = cell(json!({"code": "x"})).json();
    assert_eq!(
        (j["value"].as_str(), j["restarted"].as_bool()),
        (Some("41"), Some(false)),
        "{j}"
    );
    let j = cell(json!({"code": "def f():\n    raise ValueError('bad')\nf()"})).json();
    assert_eq!(j["status"], "error");
    assert_eq!(j["error"]["name"], "ValueError");
    assert_eq!(j["error"]["value"], "bad");
    let tb = j["error"]["traceback"].as_str().unwrap();
    assert!(
        tb.contains("<cell-3>") && tb.contains("in f") && !tb.contains("_cell("),
        "{tb}"
    );
    // The host's files are not there for the cell.
    let secret = s.dir.path().join("secret");
    std::fs::write(&secret, "host-secret").unwrap();
    let j =
        cell(json!({"code": format!("open({:?}).read()", secret.display().to_string())})).json();
    assert_eq!(j["error"]["name"], "FileNotFoundError", "{j}");
    // Output past the cap is cut and marked.
    let j = cell(json!({"code": "print('y' * 10000)", "output_bytes": 100})).json();
    assert_eq!(j["stdout"]["bytes"], 100, "{j}");
    assert_eq!(j["stdout"]["truncated"], true);
    // Past its timeout the interpreter is killed; the next cell starts a new one.
    let j = cell(json!({"code": "import time; time.sleep(60)", "timeout_ms": 300})).json();
    assert_eq!(j["status"], "timeout", "{j}");
    assert_eq!(j["error"]["name"], "TimeoutError");
    let j = cell(json!({"code": "'x' in dir()"})).json();
    assert_eq!(
        (j["value"].as_str(), j["restarted"].as_bool()),
        (Some("False"), Some(true)),
        "{j}"
    );
    let j = cell(json!({"code": "import os; os._exit(3)"})).json();
    assert_eq!(j["status"], "exited", "{j}");
    assert!(
        j["error"]["value"]
            .as_str()
            .unwrap()
            .contains("exit code 3"),
        "{j}"
    );
    // Bounds and bad input: each a 4xx naming the field.
    let big = "#".repeat((1 << 20) + 1);
    let r = cell(json!({"code": big}));
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (400, Some("code"))
    );
    let r = cell(json!({"code": "1", "language": "ruby"}));
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (400, Some("unknown-language"))
    );
    let r = cell(json!({"code": "1", "timeout_ms": 10_000_000}));
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (403, Some("timeout_ms"))
    );
    let r = cell(json!({"code": "1", "context": "nope"}));
    assert_eq!(r.status, 404);
    let r = cell(json!({"code": "1", "bogus": 1}));
    assert_eq!(r.status, 400);
    // Contexts: each its own interpreter, at most eight.
    let c = s.post(
        &format!("/v1/sandboxes/{id}/contexts"),
        &json!({"cwd": "../x"}),
    );
    assert_eq!(
        (c.status, c.json()["error"]["field"].as_str()),
        (400, Some("cwd"))
    );
    s.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({"command": ["mkdir", "sub"]}),
    );
    let c = s.post(
        &format!("/v1/sandboxes/{id}/contexts"),
        &json!({"cwd": "sub"}),
    );
    assert_eq!(c.status, 201, "{:?}", c.json());
    let ctx = c.json()["id"].as_str().unwrap().to_owned();
    let j = cell(json!({"code": "import os; os.getcwd()", "context": ctx})).json();
    assert_eq!(j["value"], "'/workspace/sub'", "{j}");
    for _ in 0..6 {
        assert_eq!(
            s.post(&format!("/v1/sandboxes/{id}/contexts"), &json!({}))
                .status,
            201
        );
    }
    let r = s.post(&format!("/v1/sandboxes/{id}/contexts"), &json!({}));
    assert_eq!(r.status, 409, "{:?}", r.json());
    let r = s.req("DELETE", &format!("/v1/sandboxes/{id}/contexts/{ctx}"), b"");
    assert_eq!(r.status, 204);
    assert_eq!(cell(json!({"code": "1", "context": ctx})).status, 404);
    let list = s.get(&format!("/v1/sandboxes/{id}/contexts")).json();
    assert_eq!(list.as_array().unwrap().len(), 7, "{list}");
    // The session's end takes its interpreters with it.
    assert_eq!(
        s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"").status,
        200
    );
    assert_eq!(cell(json!({"code": "1"})).status, 410);
}

/// Python that attacks from inside: a host file, a write outside, a host the server does not
/// allow; prints one word per attack.
fn attack_code(secret: &Path, outside: &Path) -> String {
    format!(
        "import urllib.request\n\
         try:\n    open({secret:?}).read(); print('READ')\nexcept OSError:\n    print('no-read')\n\
         try:\n    open({outside:?}, 'w').write('x'); print('WROTE')\nexcept OSError:\n    print('no-write')\n\
         try:\n    urllib.request.urlopen('http://denied.example/', timeout=5); print('CONNECTED')\nexcept Exception:\n    print('no-net')\n",
        secret = secret.display().to_string(),
        outside = outside.display().to_string(),
    )
}

/// Runs through templates (plain and warm Python, direct and through the agent) hold the same
/// boundary as cold runs, and report which engine made their sandbox; the metrics count runs by
/// engine.
#[test]
fn runs_through_templates_hold_the_boundary() {
    let s = Server::start(
        "[limits]\nmemory = \"512MiB\"\ntimeout = \"60s\"\n[network]\nallow = [\"pypi.org\"]\n",
        &["--warm-python", "--warm-python-modules", "json"],
    );
    let secret = s.dir.path().join("secret");
    std::fs::write(&secret, "host secret").unwrap();
    let outside = s.dir.path().join("written-from-inside");
    let code = attack_code(&secret, &outside);
    let runs = [
        // Python code without files: python3 -c CODE, forked from the warm interpreter.
        (
            json!({"language": "python", "code": code, "allow_net": ["pypi.org"]}),
            "template-warm",
        ),
        // A command: a plain template.
        (
            json!({"command": ["python3", "-c", code], "allow_net": ["pypi.org"]}),
            "template",
        ),
        // With a file to write: written by the sandbox's init, the code forked from the warm
        // interpreter all the same.
        (
            json!({"language": "python", "code": code, "files": {"data.txt": "x"}, "allow_net": ["pypi.org"]}),
            "template-warm",
        ),
        // With a file to fetch: the agent, in a sandbox from a template.
        (
            json!({"language": "python", "code": code, "fetch": ["main.py"], "allow_net": ["pypi.org"]}),
            "template",
        ),
    ];
    for (req, engine) in &runs {
        let j = s.post("/v1/run", req).json();
        assert_eq!(j["status"], "ok", "{j}");
        assert_eq!(j["stdout"]["data"], "no-read\nno-write\nno-net\n", "{j}");
        assert_eq!(j["report"]["engine"], *engine, "{j}");
        assert!(
            j["report"]["network"]["denied"].as_u64().unwrap() >= 1,
            "{j}"
        );
    }
    assert!(!outside.exists(), "a run wrote outside its sandbox");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "host secret");
    // Control: the same code on the host reads the secret (the attack is real).
    let host = Command::new("python3")
        .args([
            "-c",
            &format!("print(open({:?}).read())", secret.display().to_string()),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&host.stdout), "host secret\n");
    assert_eq!(
        s.metric("palisade_runs_total{status=\"ok\",engine=\"template-warm\"}"),
        2
    );
    assert_eq!(
        s.metric("palisade_runs_total{status=\"ok\",engine=\"template\"}"),
        2
    );
    // Without templates every run starts cold (the exec engine).
    let cold = Server::start(POLICY, &["--templates", "0"]);
    let j = cold
        .post(
            "/v1/run",
            &json!({"language": "python", "code": "print(1)"}),
        )
        .json();
    assert_eq!(
        (j["status"].as_str(), j["report"]["engine"].as_str()),
        (Some("ok"), Some("exec")),
        "{j}"
    );
    assert!(zygotes_of(cold.pid()).is_empty());
    assert_nothing_held(s.pid());
}

/// Two runs of one template share nothing: a file, a process, a variable (of the request, and one
/// set in the interpreter) of run N are not visible to run N+1, for warm and plain templates.
#[test]
fn runs_of_one_template_share_nothing() {
    let s = Server::start(POLICY, &["--warm-python"]);
    let leave = "import os, subprocess\n\
        open('/tmp/left', 'w').write('x'); open('left', 'w').write('x')\n\
        subprocess.Popen(['setsid', 'sleep', '1000'], start_new_session=True)\n\
        os.environ['SET_INSIDE'] = '1'\n\
        print(os.environ.get('K'), len([p for p in os.listdir('/proc') if p.isdigit()]) >= 3)\n";
    let look = "import os\n\
        procs = [open(f'/proc/{p}/cmdline', 'rb').read() for p in os.listdir('/proc') if p.isdigit()]\n\
        print(os.path.exists('/tmp/left'), os.path.exists('left'), any(c.split(bytes(1))[0] == b'sleep' for c in procs), os.environ.get('K'), os.environ.get('SET_INSIDE'))\n";
    for (how, engine) in [("language", "template-warm"), ("command", "template")] {
        let req = |code: &str, env: Value| {
            if how == "language" {
                json!({"language": "python", "code": code, "env": env})
            } else {
                json!({"command": ["python3", "-c", code], "env": env})
            }
        };
        let j = s.post("/v1/run", &req(leave, json!({"K": "v"}))).json();
        assert_eq!(
            (j["stdout"]["data"].as_str(), j["report"]["engine"].as_str()),
            (Some("v True\n"), Some(engine)),
            "{j}"
        );
        let j = s.post("/v1/run", &req(look, json!({}))).json();
        assert_eq!(
            (j["stdout"]["data"].as_str(), j["report"]["engine"].as_str()),
            (Some("False False False None None\n"), Some(engine)),
            "{j}"
        );
    }
    assert_nothing_held(s.pid());
}

/// At most --templates templates are kept (the least recently used goes first, its zygote with
/// it); a template whose zygote died is dropped and prepared again, and its runs go on.
#[test]
fn templates_are_bounded_and_a_dead_zygote_is_replaced() {
    let s = Server::start(POLICY, &["--templates", "2"]);
    let run = |mib: u64| {
        s.post(
            "/v1/run",
            &json!({"command": ["sh", "-c", "echo ok"], "limits": {"memory_bytes": mib << 20}}),
        )
        .json()
    };
    for mib in [100, 110, 120, 130] {
        let j = run(mib);
        assert_eq!(
            (j["stdout"]["data"].as_str(), j["report"]["engine"].as_str()),
            (Some("ok\n"), Some("template")),
            "{j}"
        );
        assert_eq!(j["report"]["limits"]["memory_bytes"], mib << 20, "{j}");
    }
    assert_eq!(s.metric("palisade_templates"), 2);
    assert!(s.metric("palisade_templates_evicted_total") >= 2);
    wait_until("evicted zygotes are gone", || {
        zygotes_of(s.pid()).len() == 2
    });
    // The most recent one is kept: another run of it prepares nothing.
    let built = s.metric("palisade_templates_built_total");
    assert_eq!(run(130)["report"]["engine"], "template");
    assert_eq!(s.metric("palisade_templates_built_total"), built);
    // Kill every zygote: the next run finds its template dead, drops it and prepares another.
    let zygotes = zygotes_of(s.pid());
    assert_eq!(zygotes.len(), 2);
    for z in &zygotes {
        let _ = Command::new("kill")
            .args(["-KILL", &z.to_string()])
            .status();
    }
    wait_until("the zygotes are dead", || {
        zygotes.iter().all(|z| {
            std::fs::read_to_string(format!("/proc/{z}/stat"))
                .map_or(true, |st| st.contains(") Z "))
        })
    });
    let j = run(130);
    assert_eq!(
        (j["stdout"]["data"].as_str(), j["report"]["engine"].as_str()),
        (Some("ok\n"), Some("template")),
        "{j}"
    );
    assert!(s.metric("palisade_templates_died_total") >= 1);
    assert_eq!(s.metric("palisade_templates_built_total"), built + 1);
    assert_nothing_held(s.pid());
}

/// Each exec of a session reports its own CPU time and whether the OOM killer killed it; an exec
/// past the session's memory ceiling is `oom`, and the session goes on.
#[test]
fn a_sessions_execs_report_their_own_oom_and_cpu() {
    let s = Server::start(POLICY, &[]);
    let info = s
        .post(
            "/v1/sandboxes",
            &json!({"limits": {"memory_bytes": 128u64 << 20}}),
        )
        .json();
    let id = info["id"].as_str().unwrap().to_owned();
    let exec = |cmd: Value| {
        s.post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": cmd}),
        )
        .json()
    };
    let j = exec(json!([
        "python3",
        "-c",
        "x = bytearray(400 << 20)\nx[::4096] = b'x' * len(x[::4096])\n"
    ]));
    assert_eq!(
        (j["status"].as_str(), j["signal"].as_i64()),
        (Some("oom"), Some(9)),
        "{j}"
    );
    assert!(j["oom_kills"].as_u64().unwrap() >= 1, "{j}");
    // The next exec in the same session works and counts no kill of its own.
    let j = exec(json!(["sh", "-c", "echo still here"]));
    assert_eq!(
        (
            j["status"].as_str(),
            j["stdout"]["data"].as_str(),
            j["oom_kills"].as_u64()
        ),
        (Some("ok"), Some("still here\n"), Some(0)),
        "{j}"
    );
    // An exec that spins until it has used 300 ms of CPU (by its own clock) reports at least
    // that (less one clock tick); a child it waited for is counted too.
    let spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n";
    let j = exec(json!(["python3", "-c", spin]));
    assert_eq!(j["status"], "ok", "{j}");
    assert!(j["cpu_time_ms"].as_f64().unwrap() >= 290.0, "{j}");
    let j = exec(json!(["sh", "-c", format!("python3 -c '{spin}'; true")]));
    assert!(j["cpu_time_ms"].as_f64().unwrap() >= 290.0, "{j}");
    // A background exec's result has them too.
    let bg = s
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": ["python3", "-c", spin], "mode": "background"}),
        )
        .json();
    let n = bg["id"].as_u64().unwrap();
    let mut r = Value::Null;
    wait_until("the background exec ends", || {
        r = s.get(&format!("/v1/sandboxes/{id}/exec/{n}")).json();
        !r["result"].is_null()
    });
    assert!(r["result"]["cpu_time_ms"].as_f64().unwrap() >= 290.0, "{r}");
    assert_eq!(r["result"]["oom_kills"], 0, "{r}");
    let fin = s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"").json();
    assert!(fin["report"]["oom_kills"].as_u64().unwrap() >= 1, "{fin}");
    assert_nothing_held(s.pid());
}

/// A session of 128 MiB of memory and 1 GiB of scratch; its id.
fn session_of_128_mib(s: &Server) -> String {
    let info = s
        .post(
            "/v1/sandboxes",
            &json!({"limits": {"memory_bytes": 128u64 << 20, "scratch_bytes": 1u64 << 30}}),
        )
        .json();
    info["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{info}"))
        .to_owned()
}

/// A tar of regular files, mode 0644.
fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

/// An exec's answer that is `ok` with `stdout`.
fn assert_ok_with(j: &Value, stdout: &str) {
    assert_eq!(
        (j["status"].as_str(), j["stdout"]["data"].as_str()),
        (Some("ok"), Some(stdout)),
        "{j}"
    );
}

/// Runs `sh -c cmd` in session `id`; the exec's answer.
fn sh(s: &Server, id: &str, cmd: &str) -> Value {
    s.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({"command": ["sh", "-c", cmd]}),
    )
    .json()
}

/// An exec that writes a file larger than the session's memory into scratch (tmpfs pages, which
/// belong to no process) is killed as `oom` in its own cgroup, and the session lives on: its
/// files can still be read and its next exec runs. With the exec's cgroup held by the session's
/// ceiling alone, the kernel killed the largest process of the whole session, its agent, and the
/// session was gone (`410`) with the exec reported as a sandbox error.
#[test]
fn an_exec_that_fills_scratch_past_the_sessions_memory_is_oom_and_the_session_lives() {
    let s = Server::start(POLICY, &[]);
    let id = session_of_128_mib(&s);
    let exec = |cmd: Value| {
        s.post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": cmd}),
        )
        .json()
    };
    let j = exec(json!(["sh", "-c", "echo kept > kept.txt"]));
    assert_eq!(j["status"], "ok", "{j}");
    let j = exec(json!([
        "sh",
        "-c",
        "exec dd if=/dev/zero of=big bs=1M count=400 2>/dev/null"
    ]));
    assert_eq!(
        (j["status"].as_str(), j["signal"].as_i64()),
        (Some("oom"), Some(9)),
        "{j}"
    );
    assert!(j["oom_kills"].as_u64().unwrap() >= 1, "{j}");
    let r = s.get(&format!("/v1/sandboxes/{id}/files/kept.txt"));
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, &b"kept\n"[..]),
        "{r:?}"
    );
    let j = exec(json!(["sh", "-c", "rm big && echo still here"]));
    assert_ok_with(&j, "still here\n");
    let fin = s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"").json();
    assert!(fin["report"]["oom_kills"].as_u64().unwrap() >= 1, "{fin}");
    assert_nothing_held(s.pid());
}

/// Two execs at once that each fill scratch within their own ceilings, but past the session's
/// memory together: the one the kernel kills is `oom`, and the session lives. With the exec cgroups under the session's
/// ceiling alone (each set as if the exec ran alone), the two together met the session's ceiling
/// first and the kernel killed its largest process, the agent: the session was gone.
#[test]
fn execs_at_once_that_together_fill_the_sessions_memory_are_oom_and_the_session_lives() {
    let s = Server::start(POLICY, &[]);
    let id = session_of_128_mib(&s);
    let exec = |cmd: &str| sh(&s, &id, cmd);
    // Both start before either has written much: each waits for the other's mark.
    let (one, two) = std::thread::scope(|sc| {
        let a = sc.spawn(|| {
            exec("touch a.go; while [ ! -e b.go ]; do sleep 0.01; done; exec dd if=/dev/zero of=a bs=1M count=100 2>/dev/null")
        });
        let b = sc.spawn(|| {
            exec("touch b.go; while [ ! -e a.go ]; do sleep 0.01; done; exec dd if=/dev/zero of=b bs=1M count=100 2>/dev/null")
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    // 200 MiB do not fit: the kernel kills among the two (one that ended first may have
    // written its whole file), and no exec is a sandbox error.
    for j in [&one, &two] {
        let st = (j["status"].as_str(), j["signal"].as_i64());
        assert!(
            st == (Some("oom"), Some(9)) || st == (Some("ok"), None),
            "{j} (the two: {one} {two})"
        );
    }
    assert!(
        one["status"] == "oom" || two["status"] == "oom",
        "neither was killed: {one} {two}"
    );
    let j = exec("rm a b && echo still here");
    assert_ok_with(&j, "still here\n");
    let fin = s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"").json();
    assert!(fin["report"]["oom_kills"].as_u64().unwrap() >= 1, "{fin}");
    assert_nothing_held(s.pid());
}

/// Files and archives larger than what the session's memory leaves the agent move through it in
/// both directions, and the session lives: the agent writes what it is sent to the disk as it
/// arrives and sends a file or an archive back in pieces. It held each whole before (an 80 MiB
/// file written in took 80 MiB of the agent's memory beside the file's own 80 MiB in scratch, in
/// a 128 MiB session), and the kernel killed the agent, the largest process of the session.
#[test]
fn files_and_archives_past_the_agents_room_move_in_pieces_and_the_session_lives() {
    let s = Server::start(POLICY, &["--max-body", "100MiB", "--max-fetch", "100MiB"]);
    let id = session_of_128_mib(&s);
    let exec = |cmd: &str| sh(&s, &id, cmd);
    const SIZE: usize = 80 << 20;
    let data: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
    let r = s.req("PUT", &format!("/v1/sandboxes/{id}/files/big"), &data);
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
    let r = s.get(&format!("/v1/sandboxes/{id}/files/big"));
    assert_eq!(
        r.status,
        200,
        "{}",
        String::from_utf8_lossy(&r.body[..r.body.len().min(500)])
    );
    assert!(
        r.body == data,
        "the file read back differs ({} bytes)",
        r.body.len()
    );
    let r = s.get(&format!("/v1/sandboxes/{id}/archive"));
    assert_eq!(
        r.status,
        200,
        "{}",
        String::from_utf8_lossy(&r.body[..r.body.len().min(500)])
    );
    let mut ar = tar::Archive::new(&r.body[..]);
    let mut back = Vec::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().to_str() == Some("big") {
            std::io::Read::read_to_end(&mut e, &mut back).unwrap();
        }
    }
    assert!(
        back == data,
        "the archive's file differs ({} bytes)",
        back.len()
    );
    drop((r, back));
    let r = s.req("DELETE", &format!("/v1/sandboxes/{id}/files/big"), b"");
    assert_eq!(r.status, 204);
    let tar = tar_of(&[("t/inner", &data)]);
    let r = s.req("PUT", &format!("/v1/sandboxes/{id}/archive?path=up"), &tar);
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
    let j = exec("wc -c < up/t/inner; echo still here");
    assert_ok_with(&j, "83886080\nstill here\n");
    s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"");
    assert_nothing_held(s.pid());
}

/// A file or an archive written into a session whose memory is (nearly) full is refused with
/// `no-space`, naming what is left, and the session lives; one that fits holds its room against
/// an exec running beside it, which meets the execs' ceiling rather than the session's. Without
/// the room held, the file was charged past the session's ceiling and the kernel killed the
/// agent, the session's largest process.
#[test]
fn a_file_written_into_a_full_session_is_refused_and_the_session_lives() {
    let s = Server::start(POLICY, &["--max-body", "64MiB"]);
    let id = session_of_128_mib(&s);
    let exec = |cmd: &str| sh(&s, &id, cmd);
    let j = exec("dd if=/dev/zero of=a bs=1M count=90 2>/dev/null");
    assert_eq!(j["status"], "ok", "{j}");
    let data = vec![7u8; 40 << 20];
    let r = s.req("PUT", &format!("/v1/sandboxes/{id}/files/f"), &data);
    let e = r.json();
    assert_eq!(
        (
            r.status,
            e["error"]["field"].as_str(),
            e["error"]["value"].as_str()
        ),
        (400, Some("path"), Some("no-space")),
        "{e}"
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bytes of memory left"),
        "{e}"
    );
    let tar = tar_of(&[("t", &data)]);
    let r = s.req("PUT", &format!("/v1/sandboxes/{id}/archive"), &tar);
    let e = r.json();
    assert_eq!(
        (
            r.status,
            e["error"]["field"].as_str(),
            e["error"]["value"].as_str()
        ),
        (400, Some("archive"), Some("no-space")),
        "{e}"
    );
    // Room made: the file fits, and holds its room against an exec that starts filling scratch
    // before it and goes on after it.
    let j = exec("rm a");
    assert_eq!(j["status"], "ok", "{j}");
    // The exec waits a moment before it fills scratch, so that the write's room is taken first.
    // On a slow machine (an emulated guest beside another) the 40 MiB body can take longer than
    // that to reach the server: then the exec fills scratch first and the write is refused for
    // want of room, which is right, and the exec is waited for, its file removed, and the two
    // tried again with a longer wait. A write that was let in and then lost its room to the exec
    // is what the test is for, and it fails below, at any wait.
    let mut waits = [1, 4, 16].into_iter();
    let done = loop {
        let wait = waits
            .next()
            .expect("the write was refused for want of room at every wait");
        let bg = s
            .post(
                &format!("/v1/sandboxes/{id}/exec"),
                &json!({"command": ["sh", "-c", format!("sleep {wait}; exec dd if=/dev/zero of=b bs=1M count=100 2>/dev/null")], "mode": "background"}),
            )
            .json();
        let n = bg["id"].as_u64().unwrap_or_else(|| panic!("{bg}"));
        let r = s.req("PUT", &format!("/v1/sandboxes/{id}/files/f"), &data);
        let mut done = Value::Null;
        wait_until("the background exec ends", || {
            done = s.get(&format!("/v1/sandboxes/{id}/exec/{n}")).json();
            !done["result"].is_null()
        });
        if r.status == 204 {
            break done;
        }
        let e = r.json();
        assert_eq!(
            (r.status, e["error"]["value"].as_str()),
            (400, Some("no-space")),
            "{e}"
        );
        let j = exec("rm -f b f");
        assert_eq!(j["status"], "ok", "{j}");
    };
    assert_eq!(
        (
            done["result"]["status"].as_str(),
            done["result"]["signal"].as_i64()
        ),
        (Some("oom"), Some(9)),
        "{done}"
    );
    let j = exec("wc -c < f; rm b; echo still here");
    assert_ok_with(&j, "41943040\nstill here\n");
    s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"");
    assert_nothing_held(s.pid());
}

/// What files cost a session beside their bytes is held too, and the execs' allowance to start
/// in a full session does not add up (both found by an independent attack, each having the
/// kernel kill the agent). An archive of 30,000 empty directories takes ~29 MiB of kernel memory
/// (inodes, dentries) and reserved nothing: the fifth of five had the agent killed; now each of
/// five archives of 20,000 is `204` or `no-space`. Files written through the agent past the room, then execs that each
/// fill scratch: each exec's start gave the execs a quarter of the room more than they held,
/// files kept it, and the fifth such exec took the session past its ceiling; now each is `oom`.
#[test]
fn entries_and_execs_past_the_room_cost_an_exec_or_a_write_never_the_agent() {
    let s = Server::start(POLICY, &["--max-body", "32MiB"]);
    let id = session_of_128_mib(&s);
    let exec = |cmd: &str| sh(&s, &id, cmd);
    let mut b = tar::Builder::new(Vec::new());
    for i in 0..20_000 {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        b.append_data(&mut h, format!("d{i:06}"), std::io::empty())
            .unwrap();
    }
    let dirs = b.into_inner().unwrap();
    let mut refused = 0;
    for i in 0..5 {
        let r = s.req(
            "PUT",
            &format!("/v1/sandboxes/{id}/archive?path=a{i}"),
            &dirs,
        );
        match r.status {
            204 => {}
            400 if r.json()["error"]["value"] == "no-space" => refused += 1,
            _ => panic!(
                "archive {i}: {} {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            ),
        }
    }
    assert!(
        refused >= 1,
        "five archives of 30,000 directories all written"
    );
    assert_ok_with(&exec("rm -r a0 a1 a2 a3 a4 2>/dev/null; echo ok"), "ok\n");
    // 75 MB through the agent, past the room; then execs that fill scratch.
    let f = vec![3u8; 15_000_000];
    for i in 0..5 {
        let r = s.req("PUT", &format!("/v1/sandboxes/{id}/files/p{i}"), &f);
        assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
    }
    for i in 0..8 {
        let j = exec(&format!("exec head -c 200000000 /dev/zero > z{i}"));
        assert_eq!(
            (j["status"].as_str(), j["signal"].as_i64()),
            (Some("oom"), Some(9)),
            "exec {i}: {j}"
        );
    }
    // The execs are at their ceiling together: an exec may have no room left to start, but a
    // removal through the agent needs none, and gives the room back.
    for i in 0..8 {
        // (An exec with no room to start made no file.)
        let r = s.req("DELETE", &format!("/v1/sandboxes/{id}/files/z{i}"), b"");
        assert!(
            r.status == 204 || r.status == 404,
            "z{i}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    assert_ok_with(&exec("echo still here"), "still here\n");
    s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"");
    assert_nothing_held(s.pid());
}

/// A session runs at most as many execs at once as the agent's room holds (its memory for each
/// is charged beside the execs'): 350 background execs took it past a 16 MiB room and the kernel
/// killed it (found by an independent attack). Past the bound an exec is refused (`409`), and
/// the session lives. A session below 16 MiB of memory is refused when made (1 and 2 MiB had
/// the agent or init killed at their first exec).
#[test]
fn a_session_runs_as_many_execs_at_once_as_its_agent_has_room_for() {
    let s = Server::start(POLICY, &[]);
    let r = s.post(
        "/v1/sandboxes",
        &json!({"limits": {"memory_bytes": 8u64 << 20}}),
    );
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (400, Some("limits.memory_bytes")),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let id = session_of_128_mib(&s);
    // 128 MiB: a room of 16 MiB, half of it for 64 execs at 128 KiB each.
    let mut refused = None;
    let mut started = Vec::new();
    for i in 0..80 {
        let r = s.post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": ["sleep", "600"], "mode": "background"}),
        );
        if r.status != 202 {
            refused = Some((i, r.status, r.json()));
            break;
        }
        started.push(r.json()["id"].as_u64().unwrap());
    }
    let (n, status, e) = refused.expect("80 execs at once in a 128 MiB session");
    assert_eq!((n, status), (64, 409), "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the most its memory allows"),
        "{e}"
    );
    // One ends: the next exec runs.
    let one = started[0];
    let r = s.post(
        &format!("/v1/sandboxes/{id}/exec/{one}/signal"),
        &json!({"signal": "KILL"}),
    );
    assert_eq!(r.status, 204);
    wait_until("the killed exec ends", || {
        !s.get(&format!("/v1/sandboxes/{id}/exec/{one}")).json()["result"].is_null()
    });
    assert_ok_with(&sh(&s, &id, "echo still here"), "still here\n");
    s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"");
    assert_nothing_held(s.pid());
}

/// What a second independent attack found still ended a session, each through the agent's
/// memory: a code-interpreter cell that filled scratch (the interpreter ran beside the agent,
/// outside the execs' cgroups); and a listing, an archive or a recursive removal of a directory
/// of 100,000 long names (the agent held every name at once). Each now leaves the agent alone:
/// the cell's interpreter is killed in its own exec cgroup, and the agent reads names a few at
/// a time.
#[test]
fn cells_and_huge_directories_cost_the_session_nothing_of_its_agent() {
    let s = Server::start(POLICY, &[]);
    let id = session_of_128_mib(&s);
    let exec = |cmd: &str| sh(&s, &id, cmd);
    let cell = s
        .post(
            &format!("/v1/sandboxes/{id}/run_code"),
            &json!({"code": "f = open('big', 'wb')\nfor i in range(400): f.write(b'x' * (1 << 20))"}),
        )
        .json();
    assert_ne!(
        cell["status"], "ok",
        "400 MiB written in a 128 MiB session: {cell}"
    );
    assert_ok_with(&exec("rm -f big; echo still here"), "still here\n");
    // 100,000 names of 247 bytes (hard links: their dentries are the exec's), then the rest of
    // the session's room filled.
    let j = exec(
        "python3 -c 'import os\nos.mkdir(\"d\"); open(\"d/f\", \"w\").close()\nfor i in range(100000): os.link(\"d/f\", \"d/%06d\" % i + \"x\" * 240)'",
    );
    assert_eq!(j["status"], "ok", "{j}");
    let j = exec("head -c 40000000 /dev/zero > pad; true");
    assert_ne!(j["status"], "sandbox-error", "{j}");
    let r = s.get(&format!("/v1/sandboxes/{id}/files?path=d"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let l = r.json();
    assert_eq!(l["truncated"], true, "a listing of 100,001 names");
    // The least names of those read (at most 100,000 are), in order.
    let names: Vec<&str> = l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(names.len() > 100, "{} names", names.len());
    assert!(names.windows(2).all(|w| w[0] < w[1]), "names out of order");
    assert!(
        names[0].starts_with("00000"),
        "the least names first: {}",
        names[0]
    );
    // More than 100,000 entries: refused, before anything is sent or (past the first piece)
    // by a body cut short.
    let mut c = send(
        &s.sock,
        "GET",
        &format!("/v1/sandboxes/{id}/archive?path=d"),
        &[],
        b"",
    );
    let mut raw = Vec::new();
    let _ = c.read_to_end(&mut raw);
    let head = String::from_utf8_lossy(&raw[..raw.len().min(300)]).into_owned();
    if head.starts_with("HTTP/1.1 200") {
        assert!(
            !chunked_answer(&raw).3,
            "an archive of 100,001 entries came whole"
        );
    } else {
        assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    }
    let r = s.req(
        "DELETE",
        &format!("/v1/sandboxes/{id}/files/d?recursive=true"),
        b"",
    );
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
    assert_ok_with(
        &exec("ls d 2>/dev/null | wc -l; rm pad; echo still here"),
        "0\nstill here\n",
    );
    s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"");
    assert_nothing_held(s.pid());
}

/// A client that walks away from a `PUT` leaves the write's memory held until the agent has
/// written it: dropped with the request, the room went back while the agent still wrote, and an
/// exec started at once was given it; the two together had the kernel kill the agent in 7 of 10
/// tries (a 32 MiB session, found by an independent attack).
#[test]
fn a_write_walked_away_from_keeps_its_room_until_it_is_written() {
    let s = Server::start(POLICY, &["--max-body", "64MiB"]);
    let info = s
        .post(
            "/v1/sandboxes",
            &json!({"limits": {"memory_bytes": 32u64 << 20, "scratch_bytes": 1u64 << 30}}),
        )
        .json();
    let id = info["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{info}"))
        .to_owned();
    let data = vec![5u8; 14_000_000];
    for i in 0..10u64 {
        let c = s.send("PUT", &format!("/v1/sandboxes/{id}/files/f"), &data);
        std::thread::sleep(std::time::Duration::from_millis(i));
        drop(c);
        let j = sh(&s, &id, "head -c 100000000 /dev/zero > fill; true");
        assert!(j["status"] == "ok" || j["status"] == "oom", "try {i}: {j}");
        for f in ["fill", "f"] {
            let r = s.req("DELETE", &format!("/v1/sandboxes/{id}/files/{f}"), b"");
            assert!(
                r.status == 204 || r.status == 404,
                "try {i}: {}",
                String::from_utf8_lossy(&r.body)
            );
        }
    }
    s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"");
    assert_nothing_held(s.pid());
}

/// A client that walks away from a file written into a session, at any point of it, leaves the
/// session whole: the frame to the agent is finished (or never begun), never cut off half-way,
/// which would have had the agent read the next request's bytes as the rest of the file.
#[test]
fn a_client_that_walks_away_from_a_write_leaves_the_session_whole() {
    let s = Server::start(POLICY, &["--max-body", "64MiB"]);
    let info = s.post("/v1/sandboxes", &json!({})).json();
    let id = info["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{info}"))
        .to_owned();
    let data = vec![b'x'; 48 << 20];
    for i in 0..12u64 {
        let c = s.send("PUT", &format!("/v1/sandboxes/{id}/files/f{i}"), &data);
        std::thread::sleep(std::time::Duration::from_millis(i * 7));
        drop(c);
        // (Whatever the walked-away write left, out of the session's memory.)
        s.req("DELETE", &format!("/v1/sandboxes/{id}/files/f{i}"), b"");
        let r = s.req("PUT", &format!("/v1/sandboxes/{id}/files/small"), b"kept");
        assert_eq!(
            r.status,
            204,
            "after walking away from write {i}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    let j = s
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": ["cat", "small"]}),
        )
        .json();
    assert_eq!(j["stdout"]["data"], "kept", "{j}");
    s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"");
    assert_nothing_held(s.pid());
}

/// The same, after what an independent attack found still ended the session: a file an earlier
/// exec left in another exec cgroup (one exec in the background held the first cgroup while
/// another wrote 80 MiB; the next exec took the first again, whose ceiling did not count the
/// other's file), and files read back through the agent (each read copied the file into its
/// answer, and the agent's allocator kept the largest buffers for good, more than the room).
/// Each later exec that fills scratch is `oom`, and the session lives.
#[test]
fn files_left_by_earlier_execs_or_read_back_do_not_cost_the_session_its_agent() {
    let s = Server::start(POLICY, &[]);
    let id = session_of_128_mib(&s);
    let exec = |cmd: &str| sh(&s, &id, cmd);
    let bg = s
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": ["sleep", "1"], "mode": "background"}),
        )
        .json();
    let n = bg["id"].as_u64().unwrap_or_else(|| panic!("{bg}"));
    let j = exec("dd if=/dev/zero of=a bs=1M count=80 2>/dev/null");
    assert_eq!(j["status"], "ok", "{j}");
    wait_until("the background exec ends", || {
        !s.get(&format!("/v1/sandboxes/{id}/exec/{n}")).json()["result"].is_null()
    });
    let j = exec("exec dd if=/dev/zero of=b bs=1M count=80 2>/dev/null");
    assert_eq!(
        (j["status"].as_str(), j["signal"].as_i64()),
        (Some("oom"), Some(9)),
        "{j}"
    );
    // Make room, then read a 15 MB file back twice.
    let j = exec("rm a b && head -c 15000000 /dev/zero > f");
    assert_eq!(j["status"], "ok", "{j}");
    for _ in 0..2 {
        let r = s.get(&format!("/v1/sandboxes/{id}/files/f"));
        assert_eq!((r.status, r.body.len()), (200, 15_000_000));
    }
    // The agent gave its buffers back (it held ~30 MiB before).
    let j = exec(
        "for p in /proc/[0-9]*; do [ \"$(cat $p/comm)\" = agent ] && \
         awk '/RssAnon/ {print $2}' $p/status; done",
    );
    let kib: u64 = j["stdout"]["data"]
        .as_str()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("{j}"));
    assert!(
        kib < 8 << 10,
        "the agent holds {kib} KiB of its own after two reads"
    );
    let j = exec("rm f && exec dd if=/dev/zero of=c bs=1M count=400 2>/dev/null");
    assert_eq!(
        (j["status"].as_str(), j["signal"].as_i64()),
        (Some("oom"), Some(9)),
        "{j}"
    );
    let j = exec("rm c && echo still here");
    assert_eq!(j["stdout"]["data"], "still here\n", "{j}");
    s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"");
    assert_nothing_held(s.pid());
}

/// A session whose execs each left a process running holds all the exec cgroups it may
/// (`MAX_EXEC_CGROUPS`, 64): a later exec shares one, with its ceiling, rather than running in
/// the session's cgroup with none (where filling scratch had the kernel kill the agent and end
/// the session, found by an independent attack).
#[test]
fn an_exec_past_the_sessions_exec_cgroups_shares_one_and_keeps_a_ceiling() {
    let s = Server::start(POLICY, &[]);
    let info = s
        .post(
            "/v1/sandboxes",
            &json!({"limits": {"memory_bytes": 128u64 << 20, "scratch_bytes": 1u64 << 30, "pids": 256}}),
        )
        .json();
    let id = info["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{info}"))
        .to_owned();
    let exec = |cmd: &str| sh(&s, &id, cmd);
    for _ in 0..66 {
        let j = exec("setsid -f sleep 1000 </dev/null >/dev/null 2>&1");
        assert_eq!(j["status"], "ok", "{j}");
    }
    let j = exec("exec dd if=/dev/zero of=big bs=1M count=400 2>/dev/null");
    assert_eq!(j["status"], "oom", "{j}");
    let j = exec("rm big && echo still here");
    assert_eq!(j["stdout"]["data"], "still here\n", "{j}");
    s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"");
    assert_nothing_held(s.pid());
}

/// A run through the agent (a file to fetch) whose program fills scratch past the run's memory:
/// the kernel kills the sandbox's largest process, which is the agent rather than `dd`, and the
/// run is `oom`, not a sandbox error; the file it could not read back is named, `oom`.
#[test]
fn a_run_whose_program_fills_scratch_past_its_memory_is_oom_even_when_its_agent_is_killed() {
    let s = Server::start(POLICY, &[]);
    let j = s
        .post(
            "/v1/run",
            &json!({
                "command": ["sh", "-c", "echo hi > out.txt; exec dd if=/dev/zero of=big bs=1M count=400 2>/dev/null"],
                "limits": {"memory_bytes": 128u64 << 20, "scratch_bytes": 1u64 << 30},
                "fetch": ["out.txt"],
            }),
        )
        .json();
    assert_eq!(j["status"], "oom", "{j}");
    assert!(j["error"].is_null(), "{j}");
    assert!(j["report"]["oom_kills"].as_u64().unwrap() >= 1, "{j}");
    // Fetched if the kernel took `dd` (its choice), named if it took the agent.
    assert!(
        j["files"]["out.txt"]["data"] == "hi\n" || j["file_errors"]["out.txt"] == "oom",
        "{j}"
    );
    assert_nothing_held(s.pid());
}

/// A streamed exec (NDJSON or SSE) whose client stays connected but stops reading still ends at
/// its deadline: the output it cannot hand over past the deadline is dropped, not waited on (it
/// held the exec, and its deadline, for as long as the client held the connection).
#[test]
fn a_streamed_exec_whose_client_stops_reading_ends_at_its_deadline() {
    let s = Server::start(POLICY, &[]);
    let id = s.post("/v1/sandboxes", &json!({})).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for mode in ["stream", "sse"] {
        let marker = unique("unread");
        let body = json!({"command": ["sh", "-c", format!("yes {marker}")], "timeout_ms": 1000, "mode": mode});
        let held = s.send(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            body.to_string().as_bytes(),
        );
        wait_until("the exec runs", || !host_pids_with(&marker).is_empty());
        wait_until("the exec is killed at its deadline", || {
            host_pids_with(&marker).is_empty()
        });
        wait_until("the session knows", || {
            s.get(&format!("/v1/sandboxes/{id}")).json()["running"] == json!([])
        });
        drop(held);
    }
    assert_eq!(
        s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"").status,
        200
    );
    assert_nothing_held(s.pid());
}

/// The runs the server has finished, every status and engine together.
fn runs_total(s: &Server) -> u64 {
    s.get("/metrics")
        .text()
        .lines()
        .filter(|l| l.starts_with("palisade_runs_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A batch whose client stops reading stops too: a run's result waits for the client with the
/// batch's place held, so at most a few results (the batch's concurrency, one, waiting to be
/// sent, and one in the channel and the connection) are held for it, not the whole batch's.
#[test]
fn a_batch_whose_client_stops_reading_holds_no_more_than_its_concurrency() {
    let s = Server::start(POLICY, &[]);
    let before = runs_total(&s);
    let run = json!({"command": ["sh", "-c", "head -c 4000000 /dev/zero"]});
    let body = json!({"runs": vec![run; 40], "concurrency": 1});
    let held = s.send("POST", "/v1/run/batch", body.to_string().as_bytes());
    wait_until("the batch has started", || runs_total(&s) > before);
    // Time for the rest of the batch, had it gone on without the client (40 runs take ~1 s
    // here); the bound below holds whatever the time.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let done = runs_total(&s) - before;
    assert!(
        done <= 4,
        "{done} runs of 40 finished for a client that reads nothing"
    );
    drop(held);
    assert_nothing_held(s.pid());
}

/// The `execs/exec-*` cgroups of the server `pid`'s runs, each with the processes in it (every
/// hierarchy; on v1 they are in the memory hierarchy only).
fn exec_cgroups(pid: u32) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for run in run_cgroups(pid) {
        // Under the run's `execs` child, which holds them all.
        let Ok(rd) = std::fs::read_dir(run.join("execs")) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir())
                && e.file_name().to_string_lossy().starts_with("exec-")
            {
                let procs =
                    std::fs::read_to_string(e.path().join("cgroup.procs")).unwrap_or_default();
                found.push((e.path().display().to_string(), procs.lines().count()));
            }
        }
    }
    found
}

/// Two execs of one session at the same time: one killed by the OOM killer, the other by a
/// `SIGKILL` of its own sent once the first was dead. Each exec has a cgroup of its own, so the
/// first is `oom` with its kill and the second `signal` with none (counted from the session's
/// cgroup, as before, the second read as `oom` too). An ended exec's cgroup is taken by a later
/// exec once nothing runs in it, counting from zero again; one an exec left a process running in
/// is not, and stays until that process is gone, here until the session goes, which leaves
/// nothing.
#[test]
fn concurrent_execs_of_a_session_count_their_own_oom_kills() {
    let s = Server::start(POLICY, &[]);
    let info = s
        .post(
            "/v1/sandboxes",
            &json!({"limits": {"memory_bytes": 128u64 << 20}}),
        )
        .json();
    let id = info["id"].as_str().unwrap().to_owned();
    let background = |cmd: Value| {
        let r = s
            .post(
                &format!("/v1/sandboxes/{id}/exec"),
                &json!({"command": cmd, "mode": "background"}),
            )
            .json();
        r["id"].as_u64().unwrap_or_else(|| panic!("{r}"))
    };
    let result = |n: u64| {
        let mut r = Value::Null;
        wait_until("a background exec ends", || {
            r = s.get(&format!("/v1/sandboxes/{id}/exec/{n}")).json();
            !r["result"].is_null()
        });
        r["result"].clone()
    };
    // B waits for A's pid, then for A to be gone, then kills itself. While A is being killed it
    // waits with shell builtins only. (Before execs had a ceiling of their own below the
    // session's, a process that allocated, a `sleep` forked, while the session was at its ceiling
    // and A's memory not yet freed could bring a second OOM kill, which took the largest process
    // left, the session's agent: seen under the VM matrix's emulator.)
    let b = background(json!([
        "sh",
        "-c",
        "while [ ! -s a.pid ]; do sleep 0.05; done; p=$(cat a.pid); \
         while kill -0 $p 2>/dev/null; do :; done; kill -9 $$"
    ]));
    let a = background(json!([
        "sh",
        "-c",
        "echo $$ > a.pid; exec python3 -c 'x = bytearray(400 << 20)\nx[::4096] = b\"x\" * len(x[::4096])'"
    ]));
    let (ra, rb) = (result(a), result(b));
    assert_eq!(
        (ra["status"].as_str(), ra["signal"].as_i64()),
        (Some("oom"), Some(9)),
        "{ra}"
    );
    assert!(ra["oom_kills"].as_u64().unwrap() >= 1, "{ra}");
    assert_eq!(
        (
            rb["status"].as_str(),
            rb["signal"].as_i64(),
            rb["oom_kills"].as_u64()
        ),
        (Some("signal"), Some(9), Some(0)),
        "{rb}"
    );
    // C leaves a process running in the cgroup it takes (B's, the first made); then D and E run
    // at once, D in A's, E in a new one. Neither counts A's kill, and three cgroups are there:
    // one with C's process, two empty (made and removed per exec, there would be only C's; made
    // per exec and kept, five).
    let exec = |cmd: Value| {
        s.post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": cmd}),
        )
        .json()
    };
    // (The exec ends once its process left its process group, which its end would kill.)
    let c = exec(json!([
        "sh",
        "-c",
        "setsid sh -c 'echo $$ > c.pid; exec sleep 1000' </dev/null >/dev/null 2>&1 & \
         while [ ! -s c.pid ]; do sleep 0.05; done; echo left"
    ]));
    assert_eq!(
        (c["status"].as_str(), c["oom_kills"].as_u64()),
        (Some("ok"), Some(0)),
        "{c}"
    );
    let d = background(json!([
        "sh",
        "-c",
        "while [ ! -e go ]; do sleep 0.05; done"
    ]));
    let e = exec(json!(["touch", "go"]));
    assert_eq!(
        (e["status"].as_str(), e["oom_kills"].as_u64()),
        (Some("ok"), Some(0)),
        "{e}"
    );
    let d = result(d);
    assert_eq!(
        (d["status"].as_str(), d["oom_kills"].as_u64()),
        (Some("ok"), Some(0)),
        "{d}"
    );
    let mut left = Vec::new();
    let one = within(
        "of the cgroups kept, only the one the exec that left a process took holds a process",
        std::time::Duration::from_secs(30),
        || {
            left = exec_cgroups(s.pid());
            left.len() == 3 && left.iter().map(|c| c.1).sum::<usize>() == 1
        },
    );
    assert!(one, "{left:?}");
    let fin = s.req("DELETE", &format!("/v1/sandboxes/{id}"), b"").json();
    assert!(fin["report"]["oom_kills"].as_u64().unwrap() >= 1, "{fin}");
    assert_nothing_held(s.pid());
}

/// The egress proxies of all a server's sessions and runs together hold at most
/// `--max-proxy-connections` connections (each a server thread, charged to no sandbox; found by an
/// independent review), shared out between the sandboxes when they are all open: session A holds
/// 6 of 8 relays and keeps them idle, session B opens 6. B gets the 2 free places and takes 2 of
/// A's for connections the rules allowed (A's longest idle are cut; A's report counts them, B's
/// what it took), and its last 2 are answered `503 proxies-full`, since A then holds no more
/// than B. Once A's are closed, B gets all 6.
#[test]
fn the_servers_proxies_hold_at_most_max_proxy_connections_together_and_share_them_out() {
    // An upstream on the host's loopback that echoes, named by an IP rule.
    let echo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = echo.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in echo.incoming().flatten() {
            std::thread::spawn(move || {
                let mut w = c.try_clone().unwrap();
                let _ = std::io::copy(&mut &c, &mut w);
            });
        }
    });
    let rule = format!("127.0.0.1:{port}");
    let s = Server::start(
        &format!("[network]\nallow = [\"{rule}\"]\n"),
        &["--max-proxy-connections", "8"],
    );
    let session = || {
        let r = s
            .post("/v1/sandboxes", &json!({"allow_net": [rule.clone()]}))
            .json();
        r["id"].as_str().unwrap_or_else(|| panic!("{r}")).to_owned()
    };
    let (a, b) = (session(), session());
    let exec = |id: &str, body: Value| s.post(&format!("/v1/sandboxes/{id}/exec"), &body).json();
    // A CONNECT through the proxy: the socket and the proxy's status line.
    let conn = format!(
        "import socket, os, time\n\
        def conn():\n\
        \x20   c = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n\
        \x20   c.sendall(b'CONNECT {rule} HTTP/1.1\\r\\n\\r\\n')\n\
        \x20   head = b''\n\
        \x20   while b'\\r\\n\\r\\n' not in head:\n\
        \x20       b = c.recv(1)\n\
        \x20       if not b: break\n\
        \x20       head += b\n\
        \x20   return c, head.split(b'\\r\\n')[0].decode()\n"
    );
    // Prints how many of its 6 relays the proxy closed while it held them.
    let hold = format!(
        "{conn}\
        cs = []\n\
        for _ in range(6):\n\
        \x20   c, status = conn()\n\
        \x20   assert status == 'HTTP/1.1 200 Connection established', status\n\
        \x20   cs.append(c)\n\
        open('opened', 'w').close()\n\
        while not os.path.exists('release'): time.sleep(0.02)\n\
        closed = 0\n\
        for c in cs:\n\
        \x20   c.settimeout(0.2)\n\
        \x20   try:\n\
        \x20       closed += c.recv(1) == b''\n\
        \x20   except socket.timeout:\n\
        \x20       pass\n\
        \x20   except ConnectionResetError:\n\
        \x20       closed += 1\n\
        print(closed)\n"
    );
    let held = exec(
        &a,
        json!({"command": ["python3", "-c", hold], "mode": "background"}),
    );
    let held = held["id"].as_u64().unwrap_or_else(|| panic!("{held}"));
    wait_until("A's connections are open", || {
        exec(&a, json!({"command": ["cat", "opened"]}))["status"] == "ok"
    });
    // How many of 6 CONNECTs the proxy answers 503 proxies-full.
    let count = format!(
        "{conn}\
        refused, cs = 0, []\n\
        for _ in range(6):\n\
        \x20   c, status = conn()\n\
        \x20   refused += status.startswith('HTTP/1.1 503')\n\
        \x20   cs.append(c)\n\
        print(refused)\n"
    );
    let refused = |id: &str| {
        let r = exec(id, json!({"command": ["python3", "-c", count]}));
        assert_eq!(r["status"], "ok", "{r}");
        r["stdout"]["data"].as_str().unwrap().trim().to_owned()
    };
    assert_eq!(
        refused(&b),
        "2",
        "B takes 2 of A's 6 places, and no more once they hold 4 each"
    );
    exec(&a, json!({"command": ["touch", "release"]}));
    let mut result = Value::Null;
    wait_until("A's holder ends", || {
        result = s.get(&format!("/v1/sandboxes/{a}/exec/{held}")).json()["result"].clone();
        !result.is_null()
    });
    assert_eq!(
        result["stdout"]["data"].as_str().map(str::trim),
        Some("2"),
        "A's connections the proxy cut for B: {result}"
    );
    let mut last = String::new();
    let freed = within(
        "A's connections are given back",
        std::time::Duration::from_secs(20),
        || {
            last = refused(&b);
            last == "0"
        },
    );
    assert!(freed, "{last} of 6 still refused once A's were closed");
    let fin = s.req("DELETE", &format!("/v1/sandboxes/{a}"), b"").json();
    assert_eq!(
        fin["report"]["network"]["cut_connections"].as_u64(),
        Some(2),
        "{fin}"
    );
    let fin = s.req("DELETE", &format!("/v1/sandboxes/{b}"), b"").json();
    let net = &fin["report"]["network"];
    assert_eq!(
        (
            net["took_connections"].as_u64(),
            net["cut_connections"].as_u64()
        ),
        (Some(2), Some(0)),
        "{net}"
    );
}

/// Flags whose value would have the server hold unbounded memory, processes or cgroups for its
/// clients, or that could never take effect, are refused before anything starts: a non-zero exit,
/// the flag and its bound named, no socket created.
#[test]
fn server_flags_past_their_bounds_are_refused_by_name() {
    let dir = TempDir::new("serve-flags");
    let sock = dir.path().join("s.sock");
    let listen = format!("unix:{}", sock.display());
    let cases: &[(&str, &[&str], &str)] = &[
        ("serve", &["--max-queue", "100001"], "at most 100000"),
        ("serve", &["--max-sessions", "0"], "from 1 to 10000"),
        (
            "serve",
            &["--max-proxy-connections", "0"],
            "from 1 to 65536",
        ),
        ("serve", &["--pool", "257"], "from 0 (off) to 256"),
        ("serve", &["--templates", "100000"], "from 0 (off) to 256"),
        ("serve", &["--max-held", "1KiB"], "at least 64KiB"),
        ("serve", &["--max-held", "lots"], "--max-held"),
        ("serve", &["--send-timeout", "500ms"], "at least 1s"),
        ("serve", &["--send-timeout", "soon"], "--send-timeout"),
        ("mcp", &["--send-timeout", "500ms"], "at least 1s"),
        ("mcp", &["--max-held", "1KiB"], "at least 64KiB"),
        ("mcp", &["--max-held", "lots"], "--max-held"),
        (
            "mcp",
            &["--send-timeout", "0s"],
            "expected a positive number",
        ),
        // A device as the token file: read through a bound, not until memory runs out.
        (
            "serve",
            &["--token-file", "/dev/zero"],
            "16 to 4096 characters",
        ),
        ("mcp", &["--max-sessions", "0"], "from 1 to 10000"),
        (
            "mcp",
            &["--allow-origin", "http://app.example/path"],
            "scheme://host[:port]",
        ),
        (
            "mcp",
            &["--allow-origin", "https://"],
            "scheme://host[:port]",
        ),
        (
            "mcp",
            &["--listen", "127.0.0.1:0", "--token-file", "/dev/zero"],
            "16 to 4096 characters",
        ),
    ];
    for (cmd, flags, bound) in cases {
        let mut c = Command::new(palisade_bin());
        c.arg(cmd);
        if *cmd == "serve" {
            c.args(["--listen", &listen]);
        }
        let out = c
            .args(*flags)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{cmd} {flags:?}: {err}");
        let (flag, value) = (flags[flags.len() - 2], flags[flags.len() - 1]);
        assert!(
            err.contains(flag) && err.contains(value) && err.contains(bound),
            "{cmd} {flags:?}: {err}"
        );
        assert!(!sock.exists(), "{cmd} {flags:?} created its socket");
    }
}

/// The server's resident memory, in bytes.
fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {status}"));
    kb << 10
}

/// The ETag of an answer.
fn r_tag(r: &Resp) -> String {
    r.header("etag")
        .unwrap_or_else(|| panic!("no ETag: {:?}", r.headers))
        .to_owned()
}

/// Two directories of the session `id`, each holding one file, whose archives are together
/// 16 MiB exactly: the paths of their `GET .../archive` (each answered whole, unlike a file).
fn archives_of_16_mib(s: &Server, id: &str) -> [String; 2] {
    assert_ok_with(
        &sh(
            s,
            id,
            "mkdir out && head -c 8388608 /dev/urandom > out/big && echo done",
        ),
        "done\n",
    );
    let first = format!("/v1/sandboxes/{id}/archive?path=out");
    // A tar's headers and end are whole blocks: the second's file makes up the rest.
    let overhead = s.get(&first).body.len() as u64 - (8 << 20);
    assert!(
        overhead.is_multiple_of(512) && overhead < 8192,
        "{overhead}"
    );
    let n = (8 << 20) - 2 * overhead;
    assert_ok_with(
        &sh(
            s,
            id,
            &format!("mkdir out2 && head -c {n} /dev/urandom > out2/big && echo done"),
        ),
        "done\n",
    );
    let second = format!("/v1/sandboxes/{id}/archive?path=out2");
    assert_eq!(s.get(&second).body.len() as u64, (8 << 20) - overhead);
    [first, second]
}

/// Sends a request and reads only the head of its answer (its status), leaving the rest of a
/// large body unread: a client that stops reading.
fn stalled(s: &Server, method: &str, path: &str) -> (UnixStream, u16) {
    let mut c = s.send(method, path, b"");
    c.set_read_timeout(Some(std::time::Duration::from_secs(120)))
        .unwrap();
    let mut head = [0u8; 12];
    c.read_exact(&mut head).unwrap();
    let status = String::from_utf8_lossy(&head[9..12]).parse().unwrap();
    (c, status)
}

/// Replies the clients have not taken hold the server's budget of bytes (`--max-held`): clients
/// that stop reading hold at most it, each request past it is refused 429 with Retry-After (a
/// read of an archive, a run, an exec), and once the stalled clients are cut at `--send-timeout`
/// all of it is back and a read goes through whole. Without the budget, every one of the forty
/// stalled reads of an 8 MiB file held its copy (sixty of a 16 MB file took the server to
/// 972 MB, found by the second attack). (A file itself now streams, a piece at a time:
/// `a_sessions_file_streams_out_a_piece_at_a_time_with_ranges`.)
#[test]
fn replies_not_taken_hold_at_most_the_servers_budget_and_stalled_clients_are_cut() {
    let s = Server::start(POLICY, &["--max-held", "16MiB", "--send-timeout", "5s"]);
    let id = session_of_128_mib(&s);
    let paths = archives_of_16_mib(&s, &id);
    let rss0 = rss_of(s.pid());
    let mut held = Vec::new();
    let mut refused = 0;
    for i in 0..40 {
        let (c, status) = stalled(&s, "GET", &paths[i % 2]);
        match status {
            200 => held.push(c),
            429 => refused += 1,
            other => panic!("{other}: {}", s.log()),
        }
    }
    assert_eq!((held.len(), refused), (2, 38), "{}", s.log());
    assert_eq!(s.metric("palisade_held_bytes"), 16 << 20);
    let grown = rss_of(s.pid()).saturating_sub(rss0);
    assert!(
        grown < 160 << 20,
        "the server grew by {} MiB for two held replies of 8 MiB",
        grown >> 20
    );
    // Full: nothing that makes a reply starts.
    let busy = s.post("/v1/run", &json!({"command": ["true"]}));
    assert_eq!(busy.status, 429, "{}", busy.text());
    assert_eq!(busy.header("retry-after"), Some("1"));
    assert_eq!(
        busy.json()["error"]["field"],
        "--max-held",
        "{}",
        busy.text()
    );
    assert_eq!(sh(&s, &id, "true")["error"]["code"], "busy");
    assert!(s.metric("palisade_held_refused_total") >= 40);
    // The stalled clients are cut at --send-timeout, and what they held comes back.
    wait_until("the stalled clients are cut", || {
        s.metric("palisade_held_bytes") == 0
    });
    for mut c in held {
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
        assert!(rest.len() < 8 << 20, "a cut client got its whole reply");
    }
    let whole = s.get(&paths[0]);
    assert_eq!(whole.status, 200);
    assert_eq!(
        whole.header("content-length"),
        Some(whole.body.len().to_string().as_str())
    );
    assert!(whole.body.len() > 8 << 20);
    assert_eq!(s.metric("palisade_held_bytes"), 0);
    assert_eq!(s.delete(&format!("/v1/sandboxes/{id}")).status, 200);
    assert_nothing_held(s.pid());
}

/// An exec's output past what the server's budget has room for is cut: the exec ends
/// `output-limit` with `cut_by_server` (not at its own cap), the output kept is within the
/// budget, and the budget is all back once the answer is taken. Output of control bytes, which
/// JSON would escape to six times its size, comes as base64.
#[test]
fn output_past_the_servers_budget_is_cut_and_says_so() {
    let s = Server::start(POLICY, &["--max-held", "2MiB"]);
    let id = session_of_128_mib(&s);
    let j = s
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": ["sh", "-c", "head -c 8000000 /dev/zero | tr '\\0' a"], "output_bytes": 16_000_000}),
        )
        .json();
    assert_eq!(
        (j["status"].as_str(), j["cut_by_server"].as_bool()),
        (Some("output-limit"), Some(true)),
        "{}",
        &j.to_string()[..j.to_string().len().min(2000)]
    );
    assert!(j["stdout"]["bytes"].as_u64().unwrap() <= 2 << 20);
    assert_eq!(j["stdout"]["truncated"], true);
    assert!(s.metric("palisade_held_cut_total") >= 1);
    assert_eq!(s.metric("palisade_held_bytes"), 0);
    // Within the budget: whole, and not said to be cut.
    let j = sh(&s, &id, "head -c 100000 /dev/zero");
    assert_eq!(j["status"], "ok");
    assert!(j.get("cut_by_server").is_none(), "{j}");
    assert_eq!(
        (
            j["stdout"]["encoding"].as_str(),
            j["stdout"]["bytes"].as_u64()
        ),
        (Some("base64"), Some(100_000))
    );
    assert!(j["stdout"]["data"].as_str().unwrap().len() < 140_000);
    // A one-shot run through the agent (a file to fetch) is cut the same way.
    let r = s
        .post(
            "/v1/run",
            &json!({"command": ["sh", "-c", "echo x > f; head -c 8000000 /dev/zero | tr '\\0' a"], "fetch": ["f"], "limits": {"output_bytes": 16_000_000}}),
        )
        .json();
    assert_eq!(
        (r["status"].as_str(), r["cut_by_server"].as_bool()),
        (Some("output-limit"), Some(true)),
        "{}",
        &r.to_string()[..r.to_string().len().min(2000)]
    );
    assert_eq!(s.metric("palisade_held_bytes"), 0);
    assert_eq!(s.delete(&format!("/v1/sandboxes/{id}")).status, 200);
    assert_nothing_held(s.pid());
}

/// Background results kept for clients count against the server's budget, but the budget drops
/// them, oldest first, when it needs the room: results nobody fetches cannot keep everyone's
/// work refused for as long as their sessions live. A poll of a dropped one is `410` naming
/// `--max-held`; the newer ones come whole.
#[test]
fn kept_results_give_their_room_to_new_work_oldest_first() {
    let s = Server::start(POLICY, &["--max-held", "8MiB"]);
    let id = session_of_128_mib(&s);
    let mut execs = Vec::new();
    for _ in 0..3 {
        let e = s
            .post(
                &format!("/v1/sandboxes/{id}/exec"),
                &json!({"command": ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' a"], "mode": "background"}),
            )
            .json()["id"]
            .as_u64()
            .unwrap();
        wait_until("the exec ends", || {
            s.get(&format!("/v1/sandboxes/{id}/exec/{e}")).json()["running"] == json!(false)
        });
        execs.push(e);
    }
    let first = s.get(&format!("/v1/sandboxes/{id}/exec/{}", execs[0]));
    assert_eq!(first.status, 410, "{}", first.text());
    assert!(first.text().contains("--max-held"), "{}", first.text());
    for e in &execs[1..] {
        let r = s.get(&format!("/v1/sandboxes/{id}/exec/{e}")).json();
        assert_eq!(
            (
                r["result"]["status"].as_str(),
                r["result"]["stdout"]["bytes"].as_u64()
            ),
            (Some("ok"), Some(3_000_000)),
            "{}",
            &r.to_string()[..r.to_string().len().min(500)]
        );
    }
    assert_eq!(s.metric("palisade_held_evicted_total"), 1);
    // New work is admitted beside the results kept (the budget is not full with them).
    let r = s
        .post(
            "/v1/run",
            &json!({"command": ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' b"]}),
        )
        .json();
    assert_eq!(
        r["status"],
        "ok",
        "{}",
        &r.to_string()[..r.to_string().len().min(500)]
    );
    assert_eq!(s.delete(&format!("/v1/sandboxes/{id}")).status, 200);
    assert_eq!(s.metric("palisade_held_bytes"), 0);
    assert_nothing_held(s.pid());
}

/// What else the budget bounds (found by an independent attack on the first version):
/// - a run that waited in the queue while replies filled the budget is refused when its turn
///   comes, not started (admitted while the queue had room, 68 waiting runs held 4.3 GB);
/// - a large JSON reply (a list of sessions with long labels) is refused while the budget is
///   full, and counted until taken otherwise (100 clients that did not read took 2.6 GB);
/// - a request body is counted as it comes and must come within `--send-timeout` plus its size
///   at 64 KiB/s (200 clients that sent most of 16 MiB and stopped took 3.2 GB);
/// - a cell holds room for its largest answer while it runs, and one that could never fit is
///   refused naming `output_bytes` (cells at once in many contexts took 1.5 GB).
#[test]
fn queued_runs_large_replies_bodies_and_cells_stay_within_the_budget() {
    let s = Server::start(
        POLICY,
        &[
            "--max-held",
            "16MiB",
            "--max-concurrency",
            "1",
            // Past the first run's end by seconds: the stalled clients hold the budget until
            // the queued run's turn and the list have been refused.
            "--send-timeout",
            "6s",
        ],
    );
    let labels: serde_json::Map<String, Value> = (0..64)
        .map(|i| (format!("l{i}"), json!("\u{1}".repeat(1000))))
        .collect();
    let id = s
        .post(
            "/v1/sandboxes",
            &json!({"limits": {"memory_bytes": 128u64 << 20}, "labels": labels}),
        )
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(s.get("/v1/sandboxes").status, 200);
    let paths = archives_of_16_mib(&s, &id);
    // One run holds the only slot; a second waits in the queue, admitted with the budget empty.
    let sock = s.sock.clone();
    let first = std::thread::spawn(move || {
        request(
            &sock,
            "POST",
            "/v1/run",
            &[],
            br#"{"command": ["sleep", "2"]}"#,
        )
        .status
    });
    wait_until("the first run runs", || s.metric("palisade_running") == 1);
    let sock = s.sock.clone();
    let queued = std::thread::spawn(move || {
        let r = request(&sock, "POST", "/v1/run", &[], br#"{"command": ["true"]}"#);
        (r.status, r.text())
    });
    wait_until("the second run waits", || {
        s.metric("palisade_queue_depth") == 1
    });
    // Two clients that stop reading archives of 8 MiB fill the budget.
    let held: Vec<UnixStream> = paths
        .iter()
        .map(|path| {
            let (c, status) = stalled(&s, "GET", path);
            assert_eq!(status, 200);
            c
        })
        .collect();
    assert_eq!(s.metric("palisade_held_bytes"), 16 << 20);
    assert_eq!(first.join().unwrap(), 200);
    let (status, text) = queued.join().unwrap();
    assert_eq!(status, 429, "{}", &text[..text.len().min(300)]);
    assert!(text.contains("--max-held"), "{text}");
    let list = s.get("/v1/sandboxes");
    assert_eq!(list.status, 429, "a list of {} bytes", list.body.len());
    wait_until("the stalled clients are cut", || {
        s.metric("palisade_held_bytes") == 0
    });
    drop(held);
    assert_eq!(s.get("/v1/sandboxes").status, 200);

    // A body that stops coming is counted while it waits, and refused at its deadline.
    let mut c = UnixStream::connect(&s.sock).unwrap();
    std::io::Write::write_all(
        &mut c,
        b"POST /v1/run HTTP/1.1\r\nHost: palisade\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n",
    )
    .unwrap();
    std::io::Write::write_all(&mut c, &[b' '; 60_000]).unwrap();
    wait_until("the body so far is counted", || {
        s.metric("palisade_held_bytes") >= 60_000
    });
    c.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut raw = Vec::new();
    let _ = c.read_to_end(&mut raw);
    let r = common::serve::parse(&raw);
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (400, Some("body")),
        "{}",
        r.text()
    );
    assert_eq!(s.metric("palisade_held_bytes"), 0);

    // A cell whose largest answer could never fit is refused by name; a smaller one runs.
    let cell = |body: Value| s.post(&format!("/v1/sandboxes/{id}/run_code"), &body);
    let r = cell(json!({"code": "print(1)", "output_bytes": 8u64 << 20}));
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (403, Some("output_bytes")),
        "{}",
        r.text()
    );
    let r = cell(json!({"code": "print(1)", "output_bytes": 100_000}));
    assert_eq!(
        (r.status, r.json()["status"].as_str()),
        (200, Some("ok")),
        "{}",
        r.text()
    );
    assert_eq!(s.metric("palisade_held_bytes"), 0);
    assert_eq!(s.delete(&format!("/v1/sandboxes/{id}")).status, 200);
    assert_nothing_held(s.pid());
}

/// Stdin sent to a program that does not read it (found by a second independent attack): a
/// background exec is answered at once and kept by its own task (its first stdin was written in
/// the request, and a client that went away meanwhile left the exec running past its deadline,
/// unknown to the session and counted among its running execs for good); a second write to an
/// exec's stdin while one waits is `409` (each waited behind the first, holding its body).
#[test]
fn stdin_a_program_does_not_read_holds_nothing_past_its_exec() {
    let s = Server::start(POLICY, &[]);
    let id = session_of_128_mib(&s);
    let marker = unique("nostdin");
    let body = json!({
        "command": ["sh", "-c", format!("sleep 600; : {marker}")],
        "mode": "background",
        "timeout_ms": 3000,
        "stdin": "x".repeat(1 << 20),
    });
    let r = s.post(&format!("/v1/sandboxes/{id}/exec"), &body);
    assert_eq!(r.status, 202, "{}", r.text());
    let e = r.json()["id"].as_u64().unwrap();
    let more = s.req(
        "POST",
        &format!("/v1/sandboxes/{id}/exec/{e}/stdin"),
        b"more",
    );
    assert_eq!(more.status, 409, "{}", more.text());
    wait_until("the exec ends at its deadline", || {
        s.get(&format!("/v1/sandboxes/{id}/exec/{e}")).json()["running"] == json!(false)
    });
    let info = s.get(&format!("/v1/sandboxes/{id}/exec/{e}")).json();
    assert_eq!(info["result"]["status"], "timeout", "{info}");
    assert!(host_pids_with(&marker).is_empty());
    assert_eq!(
        s.get(&format!("/v1/sandboxes/{id}")).json()["running"],
        json!([])
    );
    assert_eq!(s.metric("palisade_held_bytes"), 0);
    assert_eq!(s.delete(&format!("/v1/sandboxes/{id}")).status, 200);
    assert_nothing_held(s.pid());
}

/// A request's head must come whole within `--send-timeout` and in at most 64 KiB (found by a
/// second independent attack: 3,000 connections that each sent 390 KB of one header line and
/// stopped held 1.2 GB, with no deadline).
#[test]
fn request_heads_are_bounded_in_size_and_time() {
    let s = Server::start(POLICY, &["--send-timeout", "2s"]);
    let mut big = UnixStream::connect(&s.sock).unwrap();
    let mut head = b"GET /healthz HTTP/1.1\r\nHost: palisade\r\nX-Long: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 200_000));
    let _ = std::io::Write::write_all(&mut big, &head);
    big.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut raw = Vec::new();
    let _ = big.read_to_end(&mut raw);
    let answer = String::from_utf8_lossy(&raw);
    assert!(
        raw.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer}"
    );
    let mut slow = UnixStream::connect(&s.sock).unwrap();
    std::io::Write::write_all(&mut slow, b"GET /healthz HTTP/1.1\r\nHost: pal").unwrap();
    slow.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let t0 = std::time::Instant::now();
    let mut raw = Vec::new();
    let r = slow.read_to_end(&mut raw);
    assert!(r.is_ok(), "the connection was not closed: {r:?}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(20));
    // Whole heads are served as before.
    assert_eq!(s.get("/healthz").status, 200);
}

/// A session's file streams out a piece at a time, each read by the agent when the one before
/// it has gone: a file five times the server's budget (`--max-held`) and twenty times
/// `--max-fetch` comes whole; a client that stops reading holds one piece while the session
/// goes on, and gives it back when it is cut; a file replaced or shrunk while it is read cuts
/// the body short of its Content-Length, never mixing two files; `Range` gives one byte range
/// (206), 416 when the file has none of it, 400 naming `Range` for anything but one range.
#[test]
fn a_sessions_file_streams_out_a_piece_at_a_time_with_ranges() {
    let s = Server::start(
        POLICY,
        &[
            "--max-held",
            "4MiB",
            "--max-fetch",
            "1MiB",
            "--send-timeout",
            "5s",
        ],
    );
    let id = session_of_128_mib(&s);
    assert_ok_with(&sh(&s, &id, "seq 1 3000000 > f && echo done"), "done\n");
    let want: Vec<u8> = (1..=3_000_000u32)
        .map(|i| format!("{i}\n"))
        .collect::<String>()
        .into_bytes();
    let size = want.len();
    let path = format!("/v1/sandboxes/{id}/files/f");
    let r = s.get(&path);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-length"), Some(size.to_string().as_str()));
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert!(
        r.body == want,
        "{} bytes, not the file's {size}",
        r.body.len()
    );
    assert_eq!(s.metric("palisade_held_bytes"), 0);

    // Ranges.
    let ranged = |range: &str| request(&s.sock, "GET", &path, &[("Range", range)], b"");
    for (range, first, last) in [
        ("bytes=0-9", 0, 9),
        ("bytes=1000000-3500000", 1_000_000, 3_500_000),
        ("bytes=-8", size - 8, size - 1),
        ("bytes=20000000-", 20_000_000, size - 1),
        ("bytes=5-99999999999", 5, size - 1),
    ] {
        let r = ranged(range);
        assert_eq!(r.status, 206, "{range}: {}", r.text());
        assert_eq!(
            r.header("content-range"),
            Some(format!("bytes {first}-{last}/{size}").as_str()),
            "{range}"
        );
        assert!(
            r.body == want[first..=last],
            "{range}: {} bytes",
            r.body.len()
        );
    }
    assert_eq!(ranged("bytes=0-9").body, b"1\n2\n3\n4\n5\n");
    for past in [
        format!("bytes={size}-"),
        "bytes=9223372036854775807-".into(),
        "bytes=18446744073709551614-18446744073709551615".into(),
    ] {
        let r = ranged(&past);
        assert_eq!(r.status, 416, "{past}: {}", r.text());
        assert_eq!(
            r.header("content-range"),
            Some(format!("bytes */{size}").as_str())
        );
        assert_eq!(r.json()["error"]["field"], "Range");
    }
    for bad in [
        "bytes=5-2",
        "bytes=0-1,4-5",
        "items=0-1",
        "bytes=-0",
        "bytes=x-",
        "bytes=",
    ] {
        let r = ranged(bad);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert_eq!(r.json()["error"]["field"], "Range", "{bad}");
        assert!(
            r.json()["error"]["accepted"]
                .as_str()
                .unwrap()
                .contains("bytes=A-B"),
            "{bad}"
        );
    }
    assert_ok_with(&sh(&s, &id, ": > empty && echo done"), "done\n");
    let r = s.get(&format!("/v1/sandboxes/{id}/files/empty"));
    assert_eq!((r.status, r.body.len()), (200, 0));
    let r = request(
        &s.sock,
        "GET",
        &format!("/v1/sandboxes/{id}/files/empty"),
        &[("Range", "bytes=0-")],
        b"",
    );
    assert_eq!(r.status, 416, "{}", r.text());

    // A resumed download names the file it began with (If-Range: its ETag): the range while
    // the file is the same, the whole file once it changed.
    let tag = r_tag(&s.get(&path));
    let resumed = |tag: &str| {
        request(
            &s.sock,
            "GET",
            &path,
            &[("Range", "bytes=10-19"), ("If-Range", tag)],
            b"",
        )
    };
    let r = resumed(&tag);
    assert_eq!((r.status, r.body.as_slice()), (206, &want[10..20]));
    assert_eq!(r_tag(&r), tag);

    // Replaced, rewritten in place, or shrunk while a client reads it: the body stops short, and
    // what came is the first file's.
    for (change, why) in [
        ("cp f g && mv g f", "was replaced by another file"),
        ("seq 3000001 6000000 > f", "was written"),
        ("truncate -s 100 f", "shrank to 100 bytes"),
    ] {
        let (mut c, status) = stalled(&s, "GET", &path);
        assert_eq!(status, 200);
        assert_ok_with(&sh(&s, &id, &format!("{change} && echo done")), "done\n");
        let mut raw = Vec::new();
        let _ = c.read_to_end(&mut raw);
        let at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let body = &raw[at..];
        assert!(
            body.len() < size && want.starts_with(body),
            "{change}: {} bytes of {size}",
            body.len()
        );
        wait_until("the server says why", || s.log().contains(why));
        assert_ok_with(
            &sh(&s, &id, "rm -f f && seq 1 3000000 > f && echo done"),
            "done\n",
        );
    }
    let r = resumed(&tag);
    assert_eq!(r.status, 200, "a resume across a change: {}", r.text());
    assert!(r.body == want && r_tag(&r) != tag);

    // A client that stops reading holds one piece (of --max-fetch) and no more, while the
    // session and other downloads go on; cut at --send-timeout, it gives the piece back.
    let (mut c, status) = stalled(&s, "GET", &path);
    assert_eq!(status, 200);
    assert_eq!(s.metric("palisade_held_bytes"), 1 << 20, "{}", s.log());
    assert_ok_with(&sh(&s, &id, "echo on"), "on\n");
    assert!(s.get(&path).body == want);
    wait_until("the stalled client is cut", || {
        s.metric("palisade_held_bytes") == 0
    });
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    assert!(rest.len() < size, "a cut client got the whole file");
    assert_eq!(s.delete(&format!("/v1/sandboxes/{id}")).status, 200);
    assert_nothing_held(s.pid());
}

/// A chunked answer read from `raw` to its end: its head, its body, its trailers, and whether
/// its last chunk came (a body cut short has none).
fn chunked_answer(raw: &[u8]) -> (String, Vec<u8>, Vec<(String, String)>, bool) {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8_lossy(&raw[..end]).to_lowercase();
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    let (mut rest, mut body) = (&raw[end + 4..], Vec::new());
    loop {
        let Some(nl) = rest.windows(2).position(|w| w == b"\r\n") else {
            return (head, body, Vec::new(), false);
        };
        let n = usize::from_str_radix(String::from_utf8_lossy(&rest[..nl]).trim(), 16).unwrap();
        if n == 0 {
            let trailers = String::from_utf8_lossy(&rest[nl + 2..])
                .split("\r\n")
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_owned()))
                .collect();
            return (head, body, trailers, true);
        }
        if rest.len() < nl + 2 + n + 2 {
            body.extend_from_slice(&rest[(nl + 2).min(rest.len())..rest.len().min(nl + 2 + n)]);
            return (head, body, Vec::new(), false);
        }
        body.extend_from_slice(&rest[nl + 2..nl + 2 + n]);
        rest = &rest[nl + 2 + n + 2..];
    }
}

/// The names and contents of a tar's entries, in order.
fn tar_entries(tar: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut ar = tar::Archive::new(tar);
    ar.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            (name, data)
        })
        .collect()
}

/// A session's directory larger than `--max-fetch` streams out as a tar a piece at a time
/// (chunked, the count of entries skipped as a trailer to a client that takes trailers), made
/// inside as it goes: a file over 100 bytes of name, a deep one, an empty one, links and fifos
/// skipped. A directory no larger than `--max-fetch` is answered whole, as before, with
/// `Content-Length` and `X-Palisade-Skipped`; `strict=true` refuses one with an entry it would
/// skip. A file that shrinks after its header went out
/// ends the body without its last chunk; downloads left half way close their walk in the agent
/// (at most 4 are kept), and the session goes on.
#[test]
fn a_sessions_archive_past_max_fetch_streams_out_a_piece_at_a_time() {
    let s = Server::start(POLICY, &["--max-fetch", "1MiB"]);
    let id = session_of_128_mib(&s);
    let long = "n".repeat(180);
    assert_ok_with(
        &sh(
            &s,
            &id,
            &format!(
                "mkdir -p d/a/b/c && head -c 5000000 /dev/urandom > d/big && \
                 printf small > d/a/b/c/{long} && : > d/empty && ln -s /etc/passwd d/link && \
                 mkfifo d/fifo && mkdir s && printf hi > s/f && echo done"
            ),
        ),
        "done\n",
    );
    let big = s.get(&format!("/v1/sandboxes/{id}/files/d/big")).body;
    assert_eq!(big.len(), 5_000_000);
    let archive = |path: &str| {
        let mut c = common::serve::send(
            &s.sock,
            "GET",
            &format!("/v1/sandboxes/{id}/archive?path={path}&max_bytes=100000000"),
            &[("TE", "trailers")],
            b"",
        );
        let mut raw = Vec::new();
        c.read_to_end(&mut raw).unwrap();
        raw
    };
    let raw = archive("d");
    let (head, body, trailers, ended) = chunked_answer(&raw);
    assert!(ended, "no last chunk: {head}");
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    assert_eq!(
        trailers,
        vec![("x-palisade-skipped".to_owned(), "2".to_owned())],
        "{head}"
    );
    let mut entries = tar_entries(&body);
    entries.sort();
    let want: Vec<(String, Vec<u8>)> = vec![
        ("a/".into(), vec![]),
        ("a/b/".into(), vec![]),
        ("a/b/c/".into(), vec![]),
        (format!("a/b/c/{long}"), b"small".to_vec()),
        ("big".into(), big),
        ("empty".into(), vec![]),
    ];
    assert!(
        entries == want,
        "{:?}",
        entries
            .iter()
            .map(|(n, d)| (n.clone(), d.len()))
            .collect::<Vec<_>>()
    );
    // Larger than max_bytes (--max-fetch when not given): refused before anything is sent, a
    // sparse file counted as large as it says it is.
    for q in ["path=d", "path=d&max_bytes=4000000"] {
        let r = s.get(&format!("/v1/sandboxes/{id}/archive?{q}"));
        assert_eq!(r.status, 400, "{q}: {}", short(&r.text()));
        assert_eq!(r.json()["error"]["value"], "too-large", "{q}");
    }
    assert_ok_with(
        &sh(&s, &id, "mkdir sp && truncate -s 1G sp/f && echo done"),
        "done\n",
    );
    let r = s.get(&format!(
        "/v1/sandboxes/{id}/archive?path=sp&max_bytes=100000000"
    ));
    assert_eq!(r.status, 400, "{}", short(&r.text()));
    assert!(r.text().contains("sparse or not"), "{}", short(&r.text()));
    let r = s.get(&format!("/v1/sandboxes/{id}/archive?path=d&max_bytes=0"));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["field"], "max_bytes");
    // Small: whole, as before.
    let small = s.get(&format!("/v1/sandboxes/{id}/archive?path=s"));
    assert_eq!(small.status, 200);
    assert_eq!(
        small.header("content-length"),
        Some(small.body.len().to_string().as_str())
    );
    assert_eq!(small.header("x-palisade-skipped"), Some("0"));
    assert_eq!(
        tar_entries(&small.body),
        vec![("f".to_owned(), b"hi".to_vec())]
    );
    // Strict: an entry that would be skipped fails the archive, by name.
    let strict = s.get(&format!("/v1/sandboxes/{id}/archive?path=s&strict=true"));
    assert_eq!(strict.status, 200);
    assert_ok_with(&sh(&s, &id, "ln -s f s/l && echo done"), "done\n");
    let strict = s.get(&format!("/v1/sandboxes/{id}/archive?path=s&strict=true"));
    assert_eq!(strict.status, 400, "{}", short(&strict.text()));
    assert_eq!(strict.json()["error"]["value"], "not-regular");
    assert!(strict.text().contains("`l`"), "{}", short(&strict.text()));

    // A file that shrinks after its header is out: the client has stopped reading, so the
    // walk waits inside the file; then it is cut to nothing, and the body ends short.
    assert_ok_with(
        &sh(
            &s,
            &id,
            "mkdir d2 && head -c 8000000 /dev/urandom > d2/a && echo done",
        ),
        "done\n",
    );
    let mut c = common::serve::send(
        &s.sock,
        "GET",
        &format!("/v1/sandboxes/{id}/archive?path=d2&max_bytes=100000000"),
        &[],
        b"",
    );
    let mut first = vec![0u8; 4096];
    c.read_exact(&mut first).unwrap();
    assert!(first.starts_with(b"HTTP/1.1 200"));
    assert_ok_with(&sh(&s, &id, ": > d2/a && echo done"), "done\n");
    let mut raw = first;
    c.set_read_timeout(Some(std::time::Duration::from_secs(120)))
        .unwrap();
    let _ = c.read_to_end(&mut raw);
    let (_, body, _, ended) = chunked_answer(&raw);
    assert!(!ended, "a body of {} bytes ended whole", body.len());
    assert!(body.len() < 8_000_000, "{}", body.len());
    wait_until("the server logs the cut", || {
        s.log().contains("an archive's download cut short")
    });
    assert!(
        s.log().contains("shrank while it was archived"),
        "{}",
        s.log()
    );

    // Downloads left after their first bytes, more than the agent keeps open: each later one
    // still comes whole, and the session lives.
    for _ in 0..6 {
        let mut c = common::serve::send(
            &s.sock,
            "GET",
            &format!("/v1/sandboxes/{id}/archive?path=d&max_bytes=100000000"),
            &[],
            b"",
        );
        let mut some = [0u8; 4096];
        c.read_exact(&mut some).unwrap();
    }
    let (_, body, trailers, ended) = chunked_answer(&archive("d"));
    assert!(ended && trailers.len() == 1, "{trailers:?}");
    assert_eq!(tar_entries(&body).len(), 6);
    assert_ok_with(&sh(&s, &id, "echo alive"), "alive\n");
    assert_eq!(s.delete(&format!("/v1/sandboxes/{id}")).status, 200);
    assert_nothing_held(s.pid());
}

/// The walks of archives left half way (or left while their first piece was made) cannot take
/// the descriptors the session's agent needs: they hold at most half of the agent's open files
/// together, the walk going on first, and one deeper than that is refused by name (found by an
/// independent attack: four walks 50 deep left a session of 64 open files unable to exec).
#[test]
fn archives_left_half_way_leave_the_agent_its_descriptors() {
    let s = Server::start(POLICY, &["--max-fetch", "1MiB"]);
    let id = s
        .post(
            "/v1/sandboxes",
            &json!({"limits": {"open_files": 64, "memory_bytes": 128u64 << 20}}),
        )
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ok_with(
        &sh(
            &s,
            &id,
            "p=deep; for i in $(seq 20); do p=$p/d; done; mkdir -p $p && \
             head -c 3000000 /dev/urandom > $p/big && \
             p=deeper; for i in $(seq 50); do p=$p/d; done; mkdir -p $p && echo done",
        ),
        "done\n",
    );
    let path = format!("/v1/sandboxes/{id}/archive?path=deep&max_bytes=100000000");
    // Clients that stop reading keep their walks open in the agent (until --send-timeout);
    // clients that leave have theirs closed.
    let mut stalled = Vec::new();
    for i in 0..16 {
        let mut c = send(&s.sock, "GET", &path, &[], b"");
        if i % 2 == 0 {
            let mut some = [0u8; 4096];
            c.read_exact(&mut some).unwrap();
            stalled.push(c);
        }
    }
    for _ in 0..3 {
        assert_ok_with(&sh(&s, &id, "echo alive"), "alive\n");
    }
    let mut c = send(&s.sock, "GET", &path, &[("TE", "trailers")], b"");
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    let (head, body, _, ended) = chunked_answer(&raw);
    assert!(ended, "{head}");
    assert_eq!(tar_entries(&body).len(), 21);
    let r = s.get(&format!(
        "/v1/sandboxes/{id}/archive?path=deeper&max_bytes=100000000"
    ));
    assert_eq!(r.status, 400, "{}", short(&r.text()));
    assert!(
        r.text().contains("limits.open_files"),
        "{}",
        short(&r.text())
    );
    assert_ok_with(&sh(&s, &id, "echo alive"), "alive\n");
    drop(stalled);
}

/// At most 300 characters of `text`, for a failure's message.
fn short(text: &str) -> &str {
    &text[..text.char_indices().nth(300).map_or(text.len(), |(i, _)| i)]
}
