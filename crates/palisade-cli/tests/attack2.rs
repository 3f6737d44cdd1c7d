//! The second attack round (docs/audits/2026-12-04-front-ends.md): what the supervisor and the
//! long-running front ends do with state the code inside controls — a workspace's upper layer
//! after the run, the in-sandbox agent of `palisade serve` sessions, the outputs `palisade mcp`
//! keeps. Each `finding_N` test reproduces a finding from inside a real sandbox and is ignored
//! until it is fixed (un-ignore it with the fix); each `held_` test is an attack that is stopped
//! today, kept so that it stays stopped. They run as root and as the unprivileged test user.

mod common;

use common::serve::{within, McpHttp, Server, POLICY};
use common::{cli, host_pids_with, run_in_workspace, unique, TempDir};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// A `palisade serve` on a unix socket.

/// A session, the way a client drives it.
impl Server {
    fn session(&self, req: &Value) -> String {
        let r = self.post("/v1/sandboxes", req);
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        r.json()["id"].as_str().unwrap().to_owned()
    }

    fn exec(&self, id: &str, script: &str) -> Value {
        let j = self
            .post(
                &format!("/v1/sandboxes/{id}/exec"),
                &json!({"command": ["sh", "-c", script]}),
            )
            .json();
        assert_eq!(j["status"], "ok", "{j}");
        j
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Shell that sends `sig` to the session's agent (it runs as the code's own user, in its pid
/// namespace: `/proc` names it).
fn signal_agent(sig: &str) -> String {
    format!(
        "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); case \"$c\" in /.palisade/agent*) kill -{sig} ${{p#/proc/}} && echo signalled;; esac; done"
    )
}

// ---------------------------------------------------------------------------------------------
// Findings.

/// Finding 1: the code stops its session's agent (`kill -STOP`, same user); an exec's deadline
/// then never takes effect: the server waits forever for the agent to answer the kill, the
/// program runs on, the request never answers (until the session's TTL, an hour by default).
#[test]
fn finding_1_a_stopped_agent_cannot_stall_an_exec_past_its_deadline() {
    let s = Server::start(POLICY, &[]);
    let id = s.session(&json!({}));
    let marker = unique("stalled");
    let script = format!("{}; sleep 1000 # {marker}", signal_agent("STOP"));
    let body = json!({"command": ["sh", "-c", script], "timeout_ms": 2000});
    // The deadline is 2 s; a minute is ample for the server to act on it, or to give up on an
    // agent that does not answer and destroy the session.
    let r = s.req_within(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        body.to_string().as_bytes(),
        Duration::from_secs(60),
    );
    let r = r.unwrap_or_else(|| {
        panic!(
            "no answer a minute after a 2 s deadline; the program is still running: {:?}",
            host_pids_with(&marker)
        )
    });
    assert!(
        r.status == 200 || r.status == 410,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    if r.status == 200 {
        assert_eq!(
            r.json()["status"],
            "timeout",
            "{}",
            String::from_utf8_lossy(&r.body)
        );
    }
    assert!(
        within("the program is gone", Duration::from_secs(30), || {
            host_pids_with(&marker).is_empty()
        }),
        "the program outlived its deadline: {:?}",
        host_pids_with(&marker)
    );
    // The server stays healthy: a new session runs.
    let id2 = s.session(&json!({}));
    s.exec(&id2, "true");
}

/// Finding 2: a client that goes away during a synchronous exec of a session leaves the program
/// running past its deadline, and the exec listed as running for good: the session then never
/// reaches its idle timeout (it lives to its TTL).
#[test]
fn finding_2_a_sync_exec_whose_client_left_still_ends_at_its_deadline() {
    let s = Server::start(POLICY, &[]);
    let id = s.session(&json!({"idle_timeout_s": 5}));
    let marker = unique("orphan");
    let body =
        json!({"command": ["sh", "-c", format!("sleep 1000 # {marker}")], "timeout_ms": 3000});
    let conn = s.send(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        body.to_string().as_bytes(),
    );
    assert!(
        within("the program started", Duration::from_secs(30), || {
            !host_pids_with(&marker).is_empty()
        }),
        "{}",
        s.log()
    );
    drop(conn);
    // Its deadline is 3 s after it started, the session's idle timeout 5 s after that.
    let gone = within(
        "the program is killed and the session idles out",
        Duration::from_secs(60),
        || {
            host_pids_with(&marker).is_empty()
                && s.get(&format!("/v1/sandboxes/{id}")).status == 410
        },
    );
    assert!(
        gone,
        "a minute later: program {:?}, session {}",
        host_pids_with(&marker),
        String::from_utf8_lossy(&s.get(&format!("/v1/sandboxes/{id}")).body)
    );
}

/// Finding 3: a background exec's result (its whole output, up to the output limit) is kept for
/// the session's life, with no bound on how many: one session's client grows the server's memory
/// by the output of every exec it starts (16 × 30 MB: 0.55 GB of RSS), for every tenant.
#[test]
fn finding_3_the_results_a_session_keeps_are_bounded() {
    let s = Server::start(POLICY, &[]);
    let id = s.session(&json!({}));
    let before = rss_kib(s.pid());
    let mut ids = Vec::new();
    for _ in 0..12 {
        let r = s.post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": ["sh", "-c", "head -c 25000000 /dev/zero | tr '\\0' a"], "mode": "background"}),
        );
        assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
        ids.push(r.json()["id"].as_u64().expect("an exec id"));
    }
    assert!(within("every exec ended", Duration::from_secs(120), || s
        .get(&format!("/v1/sandboxes/{id}"))
        .json()["running"]
        .as_array()
        .is_some_and(|a| a.is_empty())));
    let grown_mib = rss_kib(s.pid()).saturating_sub(before) >> 10;
    // 12 × 25 MB of output were made; a bounded server keeps a fraction of it.
    assert!(
        grown_mib < 128,
        "the server grew by {grown_mib} MiB keeping one session's exec results"
    );
    // What was dropped says so; a result still kept is whole.
    let kept: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|e| s.get(&format!("/v1/sandboxes/{id}/exec/{e}")).status == 200)
        .collect();
    assert!(
        !kept.is_empty() && kept.len() < ids.len(),
        "kept {kept:?} of {ids:?}"
    );
    let dropped = ids.iter().find(|e| !kept.contains(e)).unwrap();
    let r = s.get(&format!("/v1/sandboxes/{id}/exec/{dropped}"));
    assert_eq!(r.status, 410, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("exec {dropped}")) && m.contains("dropped")),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let last = s.get(&format!("/v1/sandboxes/{id}/exec/{}", kept[kept.len() - 1]));
    assert_eq!(last.json()["result"]["stdout"]["bytes"], 25_000_000);
}

/// Finding 5: a directory listing or an archive that does not fit the agent's frame bounds (2000
/// file names; 5000 empty files, whose tar headers pass `--max-fetch`) makes the server take the
/// agent for broken and destroy the whole session, instead of answering the call with an error.
#[test]
fn finding_5_a_large_listing_or_archive_keeps_the_session() {
    let s = Server::start(POLICY, &["--max-fetch", "1MiB"]);
    let id = s.session(&json!({}));
    s.exec(
        &id,
        "mkdir d t && cd d && i=0; while [ $i -lt 2000 ]; do : > file-number-$i.txt; i=$((i+1)); done; cd ../t && i=0; while [ $i -lt 5000 ]; do : > $i; i=$((i+1)); done",
    );
    let l = s.get(&format!("/v1/sandboxes/{id}/files?path=d"));
    assert!(
        l.status == 200 || (400..500).contains(&l.status) && l.status != 410,
        "listing 2000 names: {} {}",
        l.status,
        String::from_utf8_lossy(&l.body)
    );
    if l.status == 200 {
        // Cut, and said so.
        let j = l.json();
        let n = j["entries"].as_array().map_or(0, |e| e.len());
        assert!(
            j["truncated"] == true && n > 0 && n < 2000,
            "{n} entries, {}",
            j["truncated"]
        );
    }
    assert_eq!(
        s.get(&format!("/v1/sandboxes/{id}")).status,
        200,
        "the session died"
    );
    let a = s.get(&format!("/v1/sandboxes/{id}/archive?path=t"));
    assert!(
        a.status == 200 || (400..500).contains(&a.status) && a.status != 410,
        "an archive of 5000 empty files: {} {}",
        a.status,
        String::from_utf8_lossy(&a.body)
    );
    if a.status != 200 {
        // An error that names the limit.
        assert!(
            String::from_utf8_lossy(&a.body).contains("--max-fetch"),
            "{}",
            String::from_utf8_lossy(&a.body)
        );
    }
    assert_eq!(
        s.get(&format!("/v1/sandboxes/{id}")).status,
        200,
        "the session died"
    );
}

/// A cell's answer line is read only as far as the driver's own can go (its texts base64, 4/3 of
/// three caps, and 64 KiB): a forged line past that is refused without being read whole (it had
/// been read up to 18 times the cap, then decoded whole, before the cap was applied).
#[test]
fn a_forged_answer_line_is_read_no_further_than_a_real_one_can_be() {
    let s = Server::start(POLICY, &[]);
    let id = s.session(&json!({}));
    // 75 000 bytes: past 4 x 1000 + 64 KiB, within the 18 x 1000 + 64 KiB read before.
    let cell = "import sys\n\
        m = sys.modules['__main__']\n\
        m._out.write(b'{\"nonce\": \"' + m.req['nonce'].encode() + b'\", \"stdout\": \"' + b'QUFB' * 18750 + b'\"}\\n')\n\
        m._out.flush()\n";
    let j = s
        .post(
            &format!("/v1/sandboxes/{id}/run_code"),
            &json!({"code": cell, "output_bytes": 1000}),
        )
        .json();
    let text = j.to_string();
    assert!(
        text.contains("longer than 69536 bytes"),
        "a forged answer line past the bound was read: {text}"
    );
}

/// Finding 8: a cell's answer is the interpreter's line, and the interpreter is the code's: a cell
/// that writes its own answer on the driver's pipe returns 60 000 bytes of stdout under
/// `output_bytes: 1000` (up to 18 times the cap and 64 KiB more pass), marked not truncated; the
/// driver's own answer then answers the next cell.
#[test]
fn finding_8_a_cells_answer_is_held_to_its_output_cap() {
    let s = Server::start(POLICY, &[]);
    let id = s.session(&json!({}));
    let cell = "import sys, json\n\
        m = sys.modules['__main__']\n\
        m._out.write((json.dumps({'stdout': 'A' * 60000, 'stdout_truncated': False, 'stderr': '', 'stderr_truncated': False, 'value': 'V' * 5000, 'error': None}) + '\\n').encode())\n\
        m._out.flush()\n";
    let j = s
        .post(
            &format!("/v1/sandboxes/{id}/run_code"),
            &json!({"code": cell, "output_bytes": 1000}),
        )
        .json();
    let out = j["stdout"]["bytes"].as_u64().unwrap_or(0)
        + j["stderr"]["bytes"].as_u64().unwrap_or(0)
        + j["value"].as_str().map_or(0, |v| v.len() as u64);
    assert!(
        out <= 1000 || j["status"] != "ok",
        "{out} bytes answered under output_bytes 1000: status {}, stdout.truncated {}",
        j["status"],
        j["stdout"]["truncated"]
    );
    // The same answer with whatever the driver's protocol asks of it that the cell can read (its
    // own request is in the driver's globals): still held to the cap, and marked.
    let forged = concat!(
        "import sys, json\n",
        "m = sys.modules['__main__']\n",
        "a = {'stdout': 'A' * 30000, 'stdout_truncated': False, 'stderr': 'E' * 30000,\n",
        "     'stderr_truncated': False, 'value': 'V' * 5000, 'error': None}\n",
        "for k in ('nonce', 'id', 'seq'):\n",
        "    if k in getattr(m, 'req', {}): a[k] = m.req[k]\n",
        "m._out.write((json.dumps(a) + '\\n').encode())\n",
        "m._out.flush()\n",
    );
    let j = s
        .post(
            &format!("/v1/sandboxes/{id}/run_code"),
            &json!({"code": forged, "output_bytes": 1000}),
        )
        .json();
    let out = j["stdout"]["bytes"].as_u64().unwrap_or(0)
        + j["stderr"]["bytes"].as_u64().unwrap_or(0)
        + j["value"].as_str().map_or(0, |v| v.len() as u64);
    assert!(
        out <= 1000 || j["status"] != "ok",
        "{out} bytes answered under output_bytes 1000 (forged with the cell's own request): status {}, stdout.truncated {}",
        j["status"],
        j["stdout"]["truncated"]
    );
    if j["status"] == "ok" && j["stdout"]["bytes"].as_u64() != Some(0) {
        assert_eq!(j["stdout"]["truncated"], true, "{j}");
    }
    // The cells after it are answered in step: their own answers, not the forged cell's leftovers.
    for n in 2..5 {
        let j = s
            .post(
                &format!("/v1/sandboxes/{id}/run_code"),
                &json!({"code": format!("{n} * 10"), "output_bytes": 1000}),
            )
            .json();
        assert_eq!(j["value"], format!("{}", n * 10), "{j}");
    }
}

// ---------------------------------------------------------------------------------------------
// `palisade mcp` over Streamable HTTP.

struct Mcp(McpHttp);

impl Mcp {
    fn start() -> Mcp {
        let dir = TempDir::new("atk-mcp");
        std::fs::write(dir.path().join("policy.toml"), POLICY).unwrap();
        let policy = dir.path().join("policy.toml").display().to_string();
        Mcp(McpHttp::start(&[
            "--output-shown",
            "256B",
            "--policy",
            &policy,
        ]))
    }

    /// One JSON-RPC message; the session id the server gave, and the JSON-RPC answers.
    fn post(&self, session: Option<&str>, msg: &Value) -> (Option<String>, Vec<Value>) {
        let mut headers = vec![("MCP-Protocol-Version", "2025-06-18")];
        if let Some(id) = session {
            headers.push(("Mcp-Session-Id", id));
        }
        let r = self.0.post(&headers, &msg.to_string());
        let sid = r.header("mcp-session-id").map(str::to_owned);
        let text = r.text();
        let msgs = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .chain(text.starts_with('{').then_some(text.as_str()))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .collect();
        (sid, msgs)
    }

    fn session(&self) -> String {
        let (sid, _) = self.post(
            None,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "attack2", "version": "1"}}}),
        );
        let sid = sid.expect("an Mcp-Session-Id");
        self.post(
            Some(&sid),
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
        sid
    }

    fn read(&self, sid: &str, uri: &str) -> Value {
        let (_, m) = self.post(
            Some(sid),
            &json!({"jsonrpc": "2.0", "id": 3, "method": "resources/read", "params": {"uri": uri}}),
        );
        m.into_iter().find(|v| v["id"] == 3).expect("an answer")
    }
}

/// Finding 4 (fixed): the outputs `palisade mcp` keeps whole were one store for every MCP session,
/// named by a counter (`palisade://output/1/stdout`): any client of the server read any other
/// client's outputs by counting. Fixed: an output is readable only from the session that made it.
#[test]
fn finding_4_mcp_kept_outputs_are_private_to_their_session() {
    let m = Mcp::start();
    let (a, b) = (m.session(), m.session());
    let secret = unique("secret-of-a");
    let (_, res) = m.post(
        Some(&a),
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "run_code",
            "arguments": {"command": ["sh", "-c", format!("echo {secret}; seq 1 300")]}}}),
    );
    let res = res.into_iter().find(|v| v["id"] == 2).expect("a result");
    let uri = res["result"]["structuredContent"]["stdout"]["full"]
        .as_str()
        .unwrap_or_else(|| panic!("no full URI: {res}"))
        .to_owned();
    // Its own session reads it whole.
    let own = m.read(&a, &uri);
    assert!(
        own["result"]["contents"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains(&secret)),
        "{own}"
    );
    // Another session, knowing or guessing the URI, does not.
    let other = m.read(&b, &uri);
    assert!(
        other["result"].is_null(),
        "session B read A's output: {other}"
    );
    assert!(!other.to_string().contains(&secret), "{other}");
    for n in 1..5 {
        let guess = m.read(&b, &format!("palisade://output/{n}/stdout"));
        assert!(!guess.to_string().contains(&secret), "{guess}");
    }
}

// ---------------------------------------------------------------------------------------------
// The workspace.

/// Finding 6: "links out of the tree are refused" is judged on the link's words alone, but the
/// kernel resolves `..` after following the project's own links. Through a directory link the
/// project already has (`web/shared-link -> ../shared`, as monorepos and pnpm have), the code
/// makes a link whose words stay inside and that resolves to any host path; `apply` puts it in
/// the project.
#[test]
fn finding_6_a_link_through_a_project_link_is_refused() {
    let store = TempDir::new("atk-ws-link-store");
    let p = TempDir::new("atk-ws-link");
    std::fs::create_dir_all(p.path().join("web")).unwrap();
    std::fs::create_dir_all(p.path().join("shared")).unwrap();
    std::os::unix::fs::symlink("../shared", p.path().join("web/shared-link")).unwrap();
    // Up as many levels as the project is deep, each `web/shared-link/..` one more than its
    // words say.
    let depth = p.path().components().count();
    let target = format!(
        "{}{}etc/passwd",
        "web/shared-link/../".repeat(depth),
        "../".repeat(depth)
    );
    let id = run_in_workspace(store.path(), p.path(), &["ln", "-s", &target, "x"]);
    let a = cli(store.path(), &["apply", &id, "--include-risky"]);
    let made = std::fs::symlink_metadata(p.path().join("x")).is_ok();
    let host = std::fs::read_to_string(p.path().join("x")).ok();
    assert!(
        a.code == 1 && !made,
        "applied (exit {}): x -> {target} reads {:?}\n{}",
        a.code,
        host.map(|h| h.lines().next().unwrap_or_default().to_owned()),
        a.stderr
    );
    assert!(a.stderr.contains("refused"), "{}", a.stderr);
}

/// A python3 on the host that counts the files opened in `dir` (inotify `IN_OPEN`, directories
/// left out) until its stdin closes, then prints the count, or `overflow`.
const OPEN_COUNTER: &str = r#"
import ctypes, os, select, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(os.O_NONBLOCK)
assert fd >= 0 and libc.inotify_add_watch(fd, sys.argv[1].encode(), 0x20) >= 0
print("ready", flush=True)
n, over, done = 0, False, False
while True:
    r, _, _ = select.select([fd] + ([] if done else [0]), [], [], 0.2 if done else None)
    if 0 in r and not os.read(0, 4096):
        done = True
        continue
    if fd not in r:
        if done:
            break
        continue
    buf = os.read(fd, 1 << 16)
    i = 0
    while i < len(buf):
        wd, mask, cookie, ln = struct.unpack_from("iIII", buf, i)
        i += 16 + ln
        over |= bool(mask & 0x4000)
        n += 1 if (mask & 0x20 and not mask & 0x40000000) else 0
print("overflow" if over else n, flush=True)
"#;

/// Finding 7 (fixed): renames are found after the run by comparing each added file with every
/// deleted file of its size, and each comparison read the project's file again: K deleted files
/// and A added ones of one size cost K×A reads of project files, after the run and outside its
/// limits (500 × 2000: 22 s of the supervisor's time; 10 000 × 10 000 is allowed). Fixed: each
/// deleted file is read once at most.
#[test]
fn finding_7_rename_detection_reads_each_project_file_once() {
    const DELETED: usize = 200;
    let store = TempDir::new("atk-ws-ren-store");
    let p = TempDir::new("atk-ws-ren");
    let f = p.path().join("f");
    std::fs::create_dir(&f).unwrap();
    for i in 0..DELETED {
        std::fs::write(f.join(format!("{i:05}")), format!("{i:064}")).unwrap();
    }
    std::fs::write(f.join("moved"), "the same bytes, moved\n").unwrap();
    let mut counter = Command::new("python3")
        .args(["-c", OPEN_COUNTER])
        .arg(&f)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 is missing on the host");
    let mut out = BufReader::new(counter.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let id = run_in_workspace(
        store.path(),
        p.path(),
        &[
            "python3",
            "-c",
            "import os\n\
             os.rename('f/moved', 'moved')\n\
             for n in os.listdir('f'): os.unlink('f/' + n)\n\
             os.mkdir('g')\n\
             for i in range(2000): open('g/%05d' % i, 'w').write('%064d' % (i + 10**6))\n",
        ],
    );
    drop(counter.stdin.take());
    let mut count = String::new();
    out.read_line(&mut count).unwrap();
    counter.wait().unwrap();
    let opened: usize = count.trim().parse().unwrap_or_else(|_| {
        panic!("project files opened: {count:?} (the inotify queue overflowed)")
    });
    // Each deleted file read once by the supervisor at most, and `moved` once more by the
    // overlay inside (its copy-up).
    assert!(
        opened <= DELETED + 2,
        "{opened} opens of {} deleted project files",
        DELETED + 1
    );
    // The rename is still found.
    let c = cli(store.path(), &["changes", &id]);
    assert!(
        c.stdout.contains("renamed f/moved -> moved"),
        "{}",
        c.stdout
    );
}

// ---------------------------------------------------------------------------------------------
// Held.

/// The agent serves the session from inside, as the code's own user; it makes itself
/// non-dumpable first, so that the code cannot take its control socket through `/proc` (to forge
/// answers, or to send requests of its own) nor read or write its memory.
#[test]
fn held_the_code_cannot_reach_the_agents_socket_or_memory() {
    let s = Server::start(POLICY, &[]);
    let id = s.session(&json!({}));
    let script = "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); case \"$c\" in /.palisade/agent*) a=${p#/proc/};; esac; done
echo agent=$a
for n in 0 1 2 3 4 5 6 7; do readlink /proc/$a/fd/$n 2>/dev/null && echo FD-NAMED-$n; ( : < /proc/$a/fd/$n ) 2>/dev/null && echo FD-OPENED-$n; done; echo fds-tried
head -c 1 /proc/$a/mem >/dev/null 2>&1 && echo MEM-READ || echo mem-refused
cat /proc/$a/environ >/dev/null 2>&1 && echo ENV-READ || echo env-refused";
    let j = s.exec(&id, script);
    let out = j["stdout"]["data"].as_str().unwrap();
    assert!(
        out.starts_with("agent=") && !out.starts_with("agent=\n"),
        "{out}"
    );
    assert!(out.contains("fds-tried"), "{out}");
    assert!(
        !out.contains("FD-OPENED") && !out.contains("FD-NAMED"),
        "{out}"
    );
    assert!(
        out.contains("mem-refused") && out.contains("env-refused"),
        "{out}"
    );
    // The session still answers: nothing of the above disturbed the agent.
    s.exec(&id, "true");
}

/// A workspace's paths are the code's bytes: escape sequences, a newline and invalid UTF-8 in
/// names reach `palisade changes` escaped, and `palisade diff` (for `git apply`) quotes them in its
/// headers as git does.
#[test]
fn held_the_codes_names_are_escaped_in_changes_and_quoted_in_diff() {
    let store = TempDir::new("atk-ws-esc-store");
    let p = TempDir::new("atk-ws-esc");
    std::fs::write(p.path().join("README"), "x\n").unwrap();
    let id = run_in_workspace(
        store.path(),
        p.path(),
        &[
            "sh",
            "-c",
            "echo a > \"$(printf 'esc\\033]0;pwned\\007\\033[2Jname')\"; echo b > \"$(printf 'new\\nline')\"; echo c > \"$(printf 'bad\\377')\"; ln -s \"$(printf 'to\\033[31m')\" link",
        ],
    );
    let c = cli(store.path(), &["changes", &id]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    assert!(c.stdout.contains("link"), "{}", c.stdout);
    assert!(
        !c.stdout.contains('\u{1b}') && !c.stdout.contains('\u{7}'),
        "raw control bytes: {:?}",
        c.stdout
    );
    // One line per entry: the newline in a name does not make a line of its own.
    assert!(
        !c.stdout.lines().any(|l| l == "line  2 B"),
        "{:?}",
        c.stdout
    );
    let text = cli(store.path(), &["diff", &id]).stdout;
    for l in text
        .lines()
        .filter(|l| l.starts_with("diff --git") || l.starts_with("+++"))
    {
        assert!(!l.contains('\u{1b}'), "{l:?}");
    }
    assert!(
        text.contains("\"b/esc\\033]0;pwned\\007\\033[2Jname\""),
        "{text}"
    );
    assert!(text.contains("\"b/new\\nline\""), "{text}");
    assert!(text.contains("\"b/bad\\377\""), "{text}");
}
