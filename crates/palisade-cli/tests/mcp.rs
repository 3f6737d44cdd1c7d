//! `palisade mcp` driven by real MCP clients: the Python SDK's (stdio and Streamable HTTP, the
//! cases in tests/mcp/client.py) and the MCP Inspector's CLI, plus raw garbage and clients that
//! go away. Every sandbox is real. The clients come from scripts/mcp-venv.sh (CI's setup runs
//! it); a missing one fails the test.

mod common;

use common::serve::{within, McpHttp, Reap};
use common::{ci_tool, host_pids_with, palisade_bin, unique, TempDir};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CLIENT: &str = include_str!("mcp/client.py");

fn venv_python() -> PathBuf {
    ci_tool(
        "PALISADE_MCP_VENV",
        "/opt/palisade-ci/mcp-venv",
        "bin/python",
        "scripts/mcp-venv.sh",
    )
}

fn inspector() -> PathBuf {
    ci_tool(
        "PALISADE_MCP_NPM",
        "/opt/palisade-ci/mcp-npm",
        "node_modules/.bin/mcp-inspector",
        "scripts/mcp-venv.sh",
    )
}

/// The client script in a fresh directory, and a host secret the cases try to read.
struct Client {
    dir: TempDir,
    script: PathBuf,
    secret: PathBuf,
    secret_text: String,
}

fn client() -> Client {
    let dir = TempDir::new("mcp");
    let script = dir.path().join("client.py");
    std::fs::write(&script, CLIENT).unwrap();
    let secret = dir.path().join("host-secret.txt");
    let secret_text = unique("secret");
    std::fs::write(&secret, &secret_text).unwrap();
    Client {
        dir,
        script,
        secret,
        secret_text,
    }
}

impl Client {
    /// Runs the cases; returns stdout. Fails the test with the client's own traceback.
    fn run(&self, mode: &str, target: &str, cases: &[&str]) -> String {
        let out = Command::new(venv_python())
            .arg(&self.script)
            .arg(mode)
            .arg(target)
            .args(cases)
            .env("PALISADE_SECRET", &self.secret)
            .current_dir(self.dir.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the Python MCP client failed ({}):\n{stdout}\n{stderr}",
            out.status
        );
        for c in cases {
            assert!(
                stdout.contains(&format!("PASS {c} ")),
                "case {c} did not pass:\n{stdout}\n{stderr}"
            );
        }
        assert!(!stdout.contains(&self.secret_text) && !stderr.contains(&self.secret_text));
        stdout
    }
}

fn wait_gone(marker: &str, what: &str) {
    let gone = within(what, Duration::from_secs(30), || {
        host_pids_with(marker).is_empty()
    });
    assert!(
        gone,
        "{what}: processes survived: {:?}",
        host_pids_with(marker)
    );
}

#[test]
fn python_sdk_client_over_stdio_every_case() {
    let c = client();
    c.run(
        "stdio",
        &palisade_bin().display().to_string(),
        &[
            "tools",
            "run_code",
            "session",
            "bad_input",
            "attacks",
            "bounded",
            "big_output",
            "cancel",
            "progress",
            "concurrent",
        ],
    );
}

#[test]
fn python_sdk_client_over_streamable_http() {
    let c = client();
    let server = McpHttp::start(&[]);
    c.run(
        "http",
        &server.url,
        &[
            "tools",
            "run_code",
            "session",
            "bad_input",
            "big_output",
            "cancel",
            "concurrent",
        ],
    );
}

const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

#[test]
fn http_checks_origin_and_token_and_refuses_open_addresses() {
    let m = McpHttp::start(&[]);
    assert_eq!(
        m.post(&[("Origin", "https://evil.example")], INIT).status,
        403,
        "a foreign Origin is refused"
    );
    assert_eq!(
        m.post(&[("Origin", "http://localhost:6274")], INIT).status,
        200
    );
    assert_eq!(m.post(&[], INIT).status, 200);
    // Garbage and a client that goes away mid-request: the server keeps serving.
    for body in ["{not json", "[]", "", "\u{0}\u{1}"] {
        let r = m.post(&[], body);
        assert!(
            (400..500).contains(&r.status),
            "{body:?}: {} {}",
            r.status,
            r.text()
        );
    }
    {
        let mut s = std::net::TcpStream::connect(&m.addr).unwrap();
        s.write_all(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{\"jsonrpc\"")
            .unwrap();
    }
    let c = client();
    c.run("http", &m.url, &["run_code"]);

    // A token, required on every request.
    let dir = TempDir::new("mcp-token");
    let tok = dir.path().join("token");
    std::fs::write(&tok, "0123456789abcdef0123\n").unwrap();
    let m2 = McpHttp::start(&["--token-file", &tok.display().to_string()]);
    assert_eq!(m2.post(&[], INIT).status, 401);
    assert_eq!(
        m2.post(&[("Authorization", "Bearer wrong-token-0123456")], INIT)
            .status,
        401
    );
    assert_eq!(
        m2.post(&[("Authorization", "Bearer 0123456789abcdef0123")], INIT)
            .status,
        200
    );

    // Off loopback without a token it does not start.
    let out = Command::new(palisade_bin())
        .args(["mcp", "--listen", "0.0.0.0:0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token-file"));
}

/// On the 2026-07-28 revision (no sessions), closing a call's response stream is its
/// cancellation: the server kills the run. A raw client, since the Python SDK's negotiates an
/// earlier revision with this server. The control: the run is there while the stream is open.
#[test]
fn http_2026_a_closed_stream_kills_its_run() {
    let m = McpHttp::start(&[]);
    let marker = "987650013";
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"run_code","arguments":{{"command":["sh","-c","sleep {marker}"],"timeout_ms":40000}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}},"io.modelcontextprotocol/clientInfo":{{"name":"t","version":"1"}}}}}}}}"#
    );
    let mut s = std::net::TcpStream::connect(&m.addr).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: run_code\r\nContent-Length: {}\r\n\r\n{body}",
        m.addr,
        body.len()
    )
    .unwrap();
    let running = within("the run starts", Duration::from_secs(30), || {
        !host_pids_with(marker).is_empty()
    });
    assert!(running, "the run never started");
    // Still running a moment later: only the stream's end stops it.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !host_pids_with(marker).is_empty(),
        "the run ended by itself"
    );
    drop(s);
    // Well before the run's own end (its timeout is 40 s): the closed stream ended it.
    let gone = within("the run ends", Duration::from_secs(20), || {
        host_pids_with(marker).is_empty()
    });
    assert!(gone, "the run outlived its closed stream");
    // And the server did not end with it: it still answers.
    assert_eq!(m.post(&[], INIT).status, 200, "the server is gone");
}

/// On the 2026-07-28 revision over HTTP each request is a session of its own, so a whole output
/// kept as a resource could never be read back by a later request: such a call's cut output
/// says how much was cut and names no resource (before, it named one and held the bytes in the
/// server's 64 MiB for nothing). The control: the same call in a session names one, and
/// `resources/read` gives it whole.
#[test]
fn http_2026_a_cut_output_names_no_resource_that_no_request_could_read() {
    let m = McpHttp::start(&[]);
    let args = r#"{"command":["sh","-c","head -c 100000 /dev/zero | tr '\\0' x"]}"#;
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"run_code","arguments":{args},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}},"io.modelcontextprotocol/clientInfo":{{"name":"t","version":"1"}}}}}}}}"#
    );
    let r = m.post(
        &[
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "run_code"),
        ],
        &body,
    );
    assert_eq!(r.status, 200, "{r:?}");
    let text = String::from_utf8_lossy(&r.body).into_owned();
    let json = text
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap_or(&text);
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {text}"));
    let out = &v["result"]["structuredContent"]["stdout"];
    assert_eq!(out["bytes"], 100000, "{v}");
    assert!(out["omitted_bytes"].as_u64().unwrap_or(0) > 90000, "{v}");
    assert!(out["full"].is_null(), "a resource no request can read: {v}");
    // The control, in a session: the same output names a resource that reads back whole.
    let init = m.post(&[], INIT);
    let sid = init
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("mcp-session-id"))
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no session: {init:?}"));
    let in_session = |body: &str| {
        m.post(
            &[
                ("Mcp-Session-Id", sid.as_str()),
                ("MCP-Protocol-Version", "2025-06-18"),
            ],
            body,
        )
    };
    in_session(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    let answer = |r: common::serve::Resp| -> serde_json::Value {
        let text = String::from_utf8_lossy(&r.body).into_owned();
        let json = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .find(|l| l.contains("\"result\"") || l.contains("\"error\""))
            .unwrap_or(&text)
            .to_owned();
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {text}"))
    };
    let r = answer(in_session(&format!(
        r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"run_code","arguments":{args}}}}}"#
    )));
    let full = r["result"]["structuredContent"]["stdout"]["full"]
        .as_str()
        .unwrap_or_else(|| panic!("no resource in a session: {r}"))
        .to_owned();
    let read = answer(in_session(&format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"resources/read","params":{{"uri":"{full}"}}}}"#
    )));
    assert_eq!(
        read["result"]["contents"][0]["text"].as_str().map(str::len),
        Some(100000),
        "{read}"
    );
}

#[test]
fn inspector_cli_lists_and_calls_tools() {
    let bin = palisade_bin().display().to_string();
    let home = TempDir::new("mcp-inspector");
    let call = |args: &[&str]| -> serde_json::Value {
        let out = Command::new(inspector())
            .args(["--cli", &bin, "mcp"])
            .args(args)
            .env("HOME", home.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the inspector failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
    };
    let tools = call(&["--method", "tools/list"]);
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 7, "{names:?}");
    for t in tools["tools"].as_array().unwrap() {
        assert_eq!(t["outputSchema"]["type"], "object", "{t}");
        assert_eq!(t["annotations"]["openWorldHint"], false, "{t}");
    }
    let r = call(&[
        "--method",
        "tools/call",
        "--tool-name",
        "run_code",
        "--tool-arg",
        "language=python",
        "--tool-arg",
        "code=print(6 * 7)",
    ]);
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(r["structuredContent"]["stdout"]["text"], "42\n", "{r}");
    // A tool error (isError, not a JSON-RPC error): the inspector says so and exits non-zero.
    let out = Command::new(inspector())
        .args(["--cli", &bin, "mcp", "--method", "tools/call"])
        .args([
            "--tool-name",
            "sandbox_exec",
            "--tool-arg",
            "sandbox_id=sb-none",
        ])
        .args(["--tool-arg", "command=[\"true\"]"])
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success() && text.contains("tool_is_error"),
        "{text}"
    );
    // With egress allowed by the policy, the tools that run code say they reach an open world.
    let dir = TempDir::new("mcp-policy");
    let pol = dir.path().join("p.toml");
    std::fs::write(&pol, "[network]\nallow = [\"pypi.org\"]\n").unwrap();
    let out = Command::new(inspector())
        .args(["--cli", &bin, "mcp", "--policy", &pol.display().to_string()])
        .args(["--method", "tools/list"])
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for t in v["tools"].as_array().unwrap() {
        let open = t["annotations"]["openWorldHint"].as_bool().unwrap();
        let runs =
            ["run_code", "sandbox_create", "sandbox_exec"].contains(&t["name"].as_str().unwrap());
        assert_eq!(open, runs, "{t}");
    }
}

/// Raw stdio: garbage lines are skipped, a bad request gets a JSON-RPC error, and when the client
/// goes away (end of input) mid-run, the server kills the run and exits.
#[test]
fn stdio_survives_garbage_and_kills_runs_when_the_client_goes_away() {
    let marker = format!("{}", 900_000_000 + std::process::id());
    let mut child = Reap(
        Command::new(palisade_bin())
            .arg("mcp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stdin = child.0.stdin.take().unwrap();
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    let send = |w: &mut std::process::ChildStdin, s: &str| {
        w.write_all(s.as_bytes()).unwrap();
        w.write_all(b"\n").unwrap();
    };
    send(&mut stdin, "this is not json");
    send(&mut stdin, "\u{1b}[2J{{{");
    send(&mut stdin, INIT);
    out.read_line(&mut line).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["id"], 1, "{line}");
    assert_eq!(v["result"]["serverInfo"]["name"], "palisade", "{line}");
    send(
        &mut stdin,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    send(
        &mut stdin,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_code","arguments":{"command":["echo","alive"]}}}"#,
    );
    line.clear();
    out.read_line(&mut line).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        v["result"]["structuredContent"]["stdout"]["text"], "alive\n",
        "{line}"
    );
    send(
        &mut stdin,
        &format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"run_code","arguments":{{"command":["sh","-c","sleep {marker}"],"timeout_ms":40000}}}}}}"#
        ),
    );
    let t0 = Instant::now();
    while host_pids_with(&marker).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the run never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The client goes away.
    drop(stdin);
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            assert!(st.success(), "{st}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "palisade mcp did not exit at end of input"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_gone(&marker, "after the client went away");
}

/// `resources/read` is counted against `--max-held` while its answer is made: a read whose
/// answer does not fit is refused with an error naming the budget (each read made a copy of the
/// output and its JSON, with nothing to bound how many at once), and the server goes on; output
/// of control bytes, which JSON would escape to six times its size, reads back as base64.
#[test]
fn stdio_resource_reads_are_counted_against_the_budget() {
    let mut child = Reap(
        Command::new(palisade_bin())
            .args(["mcp", "--max-held", "1MiB", "--output-kept", "900KiB"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stdin = child.0.stdin.take().unwrap();
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut call = |body: &str| -> serde_json::Value {
        stdin.write_all(body.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        if !body.contains("\"id\"") {
            return serde_json::Value::Null;
        }
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    assert_eq!(call(INIT)["id"], 1);
    call(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    let full = |v: &serde_json::Value| -> String {
        v["result"]["structuredContent"]["stdout"]["full"]
            .as_str()
            .unwrap_or_else(|| panic!("no resource: {v}"))
            .to_owned()
    };
    let read = |call: &mut dyn FnMut(&str) -> serde_json::Value, id: u32, uri: &str| {
        call(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"resources/read","params":{{"uri":"{uri}"}}}}"#
        ))
    };
    // 200 KB of text: its answer (twice its JSON) fits in 1 MiB.
    let small = call(
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_code","arguments":{"command":["sh","-c","head -c 200000 /dev/zero | tr '\\0' x"]}}}"#,
    );
    let small = full(&small);
    let r = read(&mut call, 3, &small);
    assert_eq!(
        r["result"]["contents"][0]["text"].as_str().map(str::len),
        Some(200_000),
        "{r}"
    );
    // 600 KB of text: twice its JSON is past 1 MiB, so its read is refused, by name.
    let large = call(
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"run_code","arguments":{"command":["sh","-c","head -c 600000 /dev/zero | tr '\\0' y"]}}}"#,
    );
    assert_eq!(
        large["result"]["structuredContent"]["stdout"]["bytes"], 600_000,
        "{large}"
    );
    let large = full(&large);
    let r = read(&mut call, 5, &large);
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("more than the server's --max-held 1048576 allows at all"),
        "read whole past the budget: {}",
        &r.to_string()[..300]
    );
    // The server goes on; control bytes come back as base64, not escaped six times over.
    let ctl = call(
        r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"run_code","arguments":{"command":["sh","-c","head -c 100000 /dev/zero | tr '\\0' '\\001'"]}}}"#,
    );
    let ctl = full(&ctl);
    let r = read(&mut call, 7, &ctl);
    let blob = r["result"]["contents"][0]["blob"]
        .as_str()
        .unwrap_or_else(|| panic!("not base64: {}", &r.to_string()[..300]));
    assert_eq!(blob.len(), 100_000usize.div_ceil(3) * 4);
    assert_eq!(
        read(&mut call, 8, &small)["result"]["contents"][0]["text"]
            .as_str()
            .map(str::len),
        Some(200_000)
    );
    drop(stdin);
    let _ = child.0.wait();
}
