//! `rust-pool`: a KV-cache block pool in Rust behind kvpool's drive protocol, version 1.
//!
//! kvpool writes one JSON line per call to stdin (`oracle/DRIVE_PROTOCOL.md`); this program
//! answers each with one JSON line on stdout and exits at the end of stdin. Everything else
//! it has to say goes to stderr. Standard library only: `cargo build --release --offline`.
//!
//!     rust-pool [--observe] [--minimal] [--lacks NAMES] [--no-observe-lines] [--bug NAME]... [--trivial]
//!
//! `--observe` adds the whole pool to every answer (a trace's `observation`); `--minimal` is
//! the pool an engine with one KV-cache group and blocks of one hash chunk serves (no partial
//! entries, no reuse watchers, no masks, no copied keys), declared in the header's answer
//! (`"lacks"`); `--lacks a,b` declares other names lacking. A lacking pool refuses any line
//! that has what it lacks with `ProtocolViolation` (as a pool without it would), so a check
//! that sent one would fail. `--bug NAME` plants a classic mistake (see `pool::Bugs`);
//! `--trivial` answers every line with the same constant line, without reading it: the
//! pipe's own cost, for benchmarks.

mod free_queue;
mod json;
mod pool;
mod types;

use std::io::{self, BufRead, BufReader, BufWriter, Write};

use json::{obj, Json};
use pool::{refuse_if, Bugs, Pool, Refusal, Request};

const VERSION: i128 = 1;
const MAX_BLOCKS: i128 = 1 << 20;
/// What `--minimal` declares lacking (the module's doc says what that pool is).
const MINIMAL: [&str; 6] = ["several_groups", "big_block", "cache_partial_block", "unpin_blocks", "mask",
                            "_insert_block_hash"];

/// What the pool declares it lacks, and the checks that refuse a line having it.
#[derive(Default)]
struct Lacks {
    names: Vec<String>,
}

impl Lacks {
    fn has(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    /// Why a call line has something this pool lacks (None: it has all of it). Arguments out of
    /// their range are left to the pool's own refusals.
    fn refuses(&self, op: &str, a: Args, hbs: i128) -> Option<String> {
        if self.has(op) || (op == "unpin_blocks" && self.has("watcher")) {
            return Some(format!("this pool has no {}", op));
        }
        let group_ok = |g: i128| g == 0 || !(0..=u32::MAX as i128).contains(&g);
        if self.has("several_groups") {
            if let Some(g) = a.get("kv_cache_group_id").and_then(Json::as_int).filter(|&g| !group_ok(g)) {
                return Some(format!("this pool has one KV-cache group, not group {}", g));
            }
            let groups = a.get("kv_cache_group_ids").and_then(Json::as_arr);
            if groups.is_some_and(|gs| gs.iter().filter_map(Json::as_int).any(|g| !group_ok(g))) {
                return Some("this pool has one KV-cache group".into());
            }
        }
        if self.has("big_block") {
            let big = a.get("block_size").and_then(Json::as_int).filter(|&bs| bs > hbs && bs % hbs == 0);
            if let Some(bs) = big {
                return Some(format!("this pool's blocks are one hash chunk ({} tokens), not {}", hbs, bs));
            }
        }
        if self.has("mask") && a.get("block_mask").is_some_and(|m| *m != Json::Null) {
            return Some("this pool takes no block masks".into());
        }
        if self.has("null_block") && matches!(op, "cache_full_blocks" | "free_blocks" | "touch") {
            let ids = a.get("block_ids").and_then(Json::as_arr);
            if ids.is_some_and(|ids| ids.iter().any(|b| b.as_int() == Some(0))) {
                return Some("this pool has no null blocks in block tables".into());
            }
        }
        if let Some(r) = a.get("request") {
            for (field, name) in [("lora", "lora"), ("cache_salt", "salt"), ("session_id", "session")] {
                if self.has(name) && r.get(field).is_some_and(|v| *v != Json::Null) {
                    return Some(format!("this pool reads no {} of a request", name));
                }
            }
        }
        None
    }
}

/// A call line the pool cannot read: not its caller's misuse but a broken line.
struct Malformed(String);

type Args<'a> = &'a Json;

fn field<'a>(args: Args<'a>, name: &str) -> Result<&'a Json, Malformed> {
    args.get(name).ok_or_else(|| Malformed(format!("args.{}: missing", name)))
}

fn int(args: Args, name: &str) -> Result<i128, Malformed> {
    field(args, name)?.as_int().ok_or_else(|| Malformed(format!("args.{}: expected an integer", name)))
}

fn ints(args: Args, name: &str) -> Result<Vec<i128>, Malformed> {
    let items = field(args, name)?.as_arr().and_then(|items| items.iter().map(Json::as_int).collect());
    items.ok_or_else(|| Malformed(format!("args.{}: expected a list of integers", name)))
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    // Non-ASCII first: slicing a multibyte character in two would panic.
    if !text.is_ascii() || text.len() % 2 != 0 || text.bytes().any(|c| c.is_ascii_uppercase()) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

fn opt_str(value: Option<&Json>) -> Option<String> {
    value.and_then(Json::as_str).map(str::to_string)
}

fn request(args: Args) -> Result<Request, Malformed> {
    let r = field(args, "request")?;
    let bad = |what: &str| Malformed(format!("args.request.{}", what));
    let tokens = r.get("all_token_ids").and_then(Json::as_arr)
        .and_then(|t| t.iter().map(Json::as_int).collect::<Option<Vec<_>>>())
        .ok_or_else(|| bad("all_token_ids: expected a list of integers"))?;
    let hashes = r.get("block_hashes").and_then(Json::as_arr)
        .and_then(|h| h.iter().map(|x| x.as_str().and_then(unhex)).collect::<Option<Vec<_>>>())
        .ok_or_else(|| bad("block_hashes: expected a list of hex strings"))?;
    let lora = match r.get("lora") {
        None | Some(Json::Null) => None,
        Some(l) => Some(pool::Lora {
            name: opt_str(l.get("name")).ok_or_else(|| bad("lora.name"))?,
            id: l.get("id").and_then(Json::as_int).ok_or_else(|| bad("lora.id"))?,
        }),
    };
    let items = r.get("mm").and_then(Json::as_arr).map_or(&[][..], Vec::as_slice);
    let mm = items.iter().map(|item| Ok(pool::Item {
        identifier: opt_str(item.get("identifier")).ok_or_else(|| bad("mm.identifier"))?,
        offset: item.get("offset").and_then(Json::as_int).ok_or_else(|| bad("mm.offset"))?,
        length: item.get("length").and_then(Json::as_int).ok_or_else(|| bad("mm.length"))?,
    })).collect::<Result<_, Malformed>>()?;
    Ok(Request { tokens, hashes, lora, mm, cache_salt: opt_str(r.get("cache_salt")),
                 session_id: opt_str(r.get("session_id")) })
}

/// Run one call; Ok(Ok(result)) or Ok(Err(refusal)), or Err for a line that cannot be read.
fn call(pool: &mut Pool, op: &str, a: Args) -> Result<Result<Json, Refusal>, Malformed> {
    let unit = |r: Result<(), Refusal>| r.map(|()| Json::Null);
    Ok(match op {
        "get_new_blocks" => pool.get_new_blocks(int(a, "num_blocks")?).map(json::ids),
        "free_blocks" => unit(pool.free_blocks(&ints(a, "block_ids")?)),
        "touch" => unit(pool.touch(&ints(a, "block_ids")?)),
        "unpin_blocks" => {
            let name = opt_str(a.get("on_reuse")).ok_or_else(|| Malformed("args.on_reuse".into()))?;
            unit(pool.unpin_blocks(&ints(a, "block_ids")?, &name))
        }
        "evict_blocks" => unit(pool.evict_blocks(&ints(a, "block_ids")?)),
        "reset_prefix_cache" => Ok(Json::Bool(pool.reset_prefix_cache())),
        "cache_full_blocks" => {
            let mask = match a.get("block_mask") {
                None | Some(Json::Null) => None,
                Some(m) => Some(m.as_arr().and_then(|m| m.iter().map(Json::as_bool).collect::<Option<Vec<_>>>())
                    .ok_or_else(|| Malformed("args.block_mask".into()))?),
            };
            unit(pool.cache_full_blocks(&request(a)?, &ints(a, "block_ids")?, int(a, "num_cached_blocks")?,
                                        int(a, "num_full_blocks")?, int(a, "block_size")?,
                                        int(a, "kv_cache_group_id")?, mask.as_deref()))
        }
        "cache_partial_block" => {
            let replace = a.get("replace_existing_hashes").and_then(Json::as_bool).unwrap_or(false);
            pool.cache_partial_block(&request(a)?, int(a, "block_id")?, int(a, "num_tokens")?,
                                     int(a, "kv_cache_group_id")?, int(a, "block_size")?, replace)
                .map(|key| key.map_or(Json::Null, |k| Json::Str(k.concrete_hex())))
        }
        "move_block_hashes" => unit(pool.move_block_hashes(int(a, "src_id")?, int(a, "dst_id")?)),
        "emit_cached_block_events" => unit(pool.emit_cached_block_events(
            &request(a)?, int(a, "num_cached_blocks")?, int(a, "block_size")?, int(a, "kv_cache_group_id")?)),
        "take_events" => Ok(Json::Arr(pool.take_events())),
        "_insert_block_hash" => {
            let num_tokens = match field(a, "num_tokens")? {
                Json::Null => None,
                v => Some(v.as_int().ok_or_else(|| Malformed("args.num_tokens".into()))?),
            };
            unit(pool.insert_block_hash(&request(a)?, int(a, "prefix_tokens")?, int(a, "kv_cache_group_id")?,
                                        int(a, "block_id")?, num_tokens))
        }
        "_maybe_evict_cached_block" => pool.maybe_evict_cached_block(int(a, "block_id")?).map(Json::Bool),
        "get_cached_block" => {
            let hash = field(a, "block_hash")?.as_str().and_then(unhex)
                .ok_or_else(|| Malformed("args.block_hash: expected hex".into()))?;
            pool.get_cached_block(&hash, &ints(a, "kv_cache_group_ids")?)
                .map(|found| found.map_or(Json::Null, json::ids))
        }
        "is_block_writable" => pool.is_block_writable(int(a, "block_id")?).map(Json::Bool),
        "get_num_free_blocks" => Ok(Json::Int(pool.get_num_free_blocks() as i128)),
        "get_usage" => Ok(Json::Float(pool.get_usage())),
        _ => return Err(Malformed(format!("op: unknown operation {:?}", op))),
    })
}

fn new_pool(spec: &Json, bugs: Bugs, lacks: &Lacks) -> Result<Pool, String> {
    let p = spec.get("pool").ok_or("pool: missing")?;
    let num_blocks = p.get("num_blocks").and_then(Json::as_int).ok_or("pool.num_blocks: expected an integer")?;
    refuse_if(!(1..=MAX_BLOCKS).contains(&num_blocks),
              format!("pool.num_blocks: {} is not in [1, {}]", num_blocks, MAX_BLOCKS))?;
    let hbs = p.get("hash_block_size").and_then(Json::as_int).ok_or("pool.hash_block_size: expected an integer")?;
    refuse_if(!(1..=(1i128 << 31)).contains(&hbs),
              format!("pool.hash_block_size: {} is not in [1, 2**31]", hbs))?;
    let caching = p.get("enable_caching").and_then(Json::as_bool).ok_or("pool.enable_caching: expected a bool")?;
    let events = p.get("enable_kv_cache_events").and_then(Json::as_bool)
        .ok_or("pool.enable_kv_cache_events: expected a bool")?;
    let medium = opt_str(p.get("medium")).ok_or("pool.medium: expected a string")?;
    refuse_if(events && lacks.has("events"), "this pool emits no KV events".to_string())?;
    refuse_if(!caching && lacks.has("caching_off"), "this pool always caches prefixes".to_string())?;
    let (null_counted, boundary_partials) = match p.get("reference").and_then(Json::as_str).unwrap_or("0.31") {
        "0.31" => (true, false),
        "0.33" => (false, true),
        other => return Err(format!("pool.reference: this pool reproduces 0.31 and 0.33, not {}", other)),
    };
    Ok(Pool::new(num_blocks as usize, caching, hbs, events, medium, null_counted, boundary_partials, bugs))
}

struct Server {
    pool: Option<Pool>,
    bugs: Bugs,
    observe: bool,
    /// Whether the header's answer offers `observe` lines (`--no-observe-lines`: a process of
    /// protocol version 1 as first written, asked one query a line).
    observe_lines: bool,
    lacks: Lacks,
    /// The current pool reports what its metrics collector is told (the header asked for one).
    metrics: bool,
    /// The current pool is shown only where a line asks (`"show": true`), and observe answers
    /// show the blocks and keys they name (the header asked, and `--observe`).
    when_asked: bool,
    line: usize,
}

impl Server {
    fn answer(&mut self, text: &str) -> Json {
        self.line += 1;
        let answered = match json::parse(text) {
            Ok(value) => match value.get("kvpool_drive") {
                Some(version) => Ok(self.header(&value, version)),
                None => self.call_line(&value),
            },
            Err(e) => Err(Malformed(format!("not JSON: {}", e))),
        };
        answered.unwrap_or_else(|Malformed(what)| self.violation(&what))
    }

    /// A header's answer: a new pool, or why not (the current pool stays).
    fn header(&mut self, value: &Json, version: &Json) -> Json {
        let refused = |error| obj(vec![("kvpool_drive", Json::Int(VERSION)), ("ok", Json::Bool(false)),
                                       ("error", Json::Str(error))]);
        if version.as_int() != Some(VERSION) {
            return refused(format!("unsupported protocol version {}", version.dump()));
        }
        let pool = match new_pool(value, self.bugs, &self.lacks) {
            Ok(pool) => pool,
            Err(e) => return refused(e),
        };
        let asked = |name: &str| value.get("pool").and_then(|p| p.get(name)) == Some(&Json::Bool(true));
        self.metrics = asked("metrics_collector") && !self.lacks.has("metrics");
        self.when_asked = self.observe && self.observe_lines && asked("show_when_asked");
        let offered = [("observe", self.observe_lines), ("metrics", self.metrics),
                       ("show_when_asked", self.when_asked)];
        let mut fields = vec![("kvpool_drive", Json::Int(VERSION)), ("ok", Json::Bool(true))];
        fields.extend(offered.into_iter().filter(|&(_, on)| on).map(|(name, _)| (name, Json::Bool(true))));
        if !self.lacks.names.is_empty() {
            let names = self.lacks.names.iter().map(|n| Json::Str(n.clone())).collect();
            fields.push(("lacks", Json::Arr(names)));
        }
        if self.observe {
            fields.push(("observation", pool.observation()));
        }
        self.pool = Some(pool);
        obj(fields)
    }

    /// A call line's answer, or an `observe` line's.
    fn call_line(&mut self, value: &Json) -> Result<Json, Malformed> {
        let (Some(op), Some(args)) = (value.get("op").and_then(Json::as_str), value.get("args")) else {
            return Err(Malformed("expected {\"op\": ..., \"args\": {...}}".into()));
        };
        let pool = self.pool.as_mut().ok_or_else(|| Malformed("a call before any header".into()))?;
        if let Some(why) = self.lacks.refuses(op, args, pool.hbs) {
            return Err(Malformed(why));
        }
        if op == "observe" {
            let result = observe(pool, args, self.when_asked)?;
            let events = Json::Arr(Vec::new());
            return Ok(obj(vec![("result", result), ("error", Json::Null), ("events", events)]));
        }
        pool.fired.clear();
        pool.told.clear();
        let before = pool.events.len();
        let outcome = call(pool, op, args)?;
        let events = if op == "take_events" { Vec::new() } else { pool.events[before..].to_vec() };
        let fired = pool.fired.drain(..)
            .map(|(name, b)| Json::Arr(vec![Json::Str(name), Json::Int(b as i128)]))
            .collect();
        let error = outcome.as_ref().err().map(Refusal::name_and_message);
        let mut fields = vec![("result", outcome.unwrap_or(Json::Null)),
                              ("error", error.map_or(Json::Null, |(name, _)| Json::Str(name.into()))),
                              ("events", Json::Arr(events)), ("fired", Json::Arr(fired))];
        if let Some((_, message)) = error {
            fields.push(("message", Json::Str(message.into())));
        }
        if self.metrics {
            let told = pool.told.drain(..)
                .map(|(what, b)| Json::Arr(vec![Json::Str(what.into()), b.map_or(Json::Null, |b| Json::Int(b as i128))]))
                .collect();
            fields.push(("told", Json::Arr(told)));
        }
        if self.observe && (!self.when_asked || value.get("show") == Some(&Json::Bool(true))) {
            fields.push(("observation", pool.observation()));
        }
        if let Some(asked) = value.get("observe") {  // questions asked with the call, after it
            fields.push(("observed", observe(pool, asked, self.when_asked)?));
        }
        Ok(obj(fields))
    }

    fn violation(&self, what: &str) -> Json {
        eprintln!("rust-pool: line {}: {}", self.line, what);
        obj(vec![("result", Json::Null), ("error", Json::Str("ProtocolViolation".into())),
                 ("events", Json::Arr(Vec::new())), ("fired", Json::Arr(Vec::new()))])
    }
}

/// An `observe` line: the free count, each block's writability, each key's lookup, at once; with
/// `shown`, the named blocks' and keys' entries of the whole pool too.
fn observe(pool: &Pool, a: Args, shown: bool) -> Result<Json, Malformed> {
    let blocks = ints(a, "blocks")?;
    let keys = field(a, "keys")?.as_arr().ok_or_else(|| Malformed("args.keys: expected a list".into()))?;
    let no_block = |b| Malformed(format!("args.blocks: no block {}", b));
    let writable = blocks.iter().map(|&b| pool.is_block_writable(b).map(Json::Bool).map_err(|_| no_block(b)))
        .collect::<Result<_, _>>()?;
    let mut cached = Vec::with_capacity(keys.len());
    let mut named = Vec::with_capacity(keys.len());
    for k in keys {
        let (Some(hash), Some(group)) = (k.as_arr().and_then(|k| k.first()).and_then(Json::as_str).and_then(unhex),
                                         k.as_arr().and_then(|k| k.get(1)).and_then(Json::as_int)) else {
            return Err(Malformed("args.keys: expected [hex hash, group] pairs".into()));
        };
        let hit = pool.get_cached_block(&hash, &[group]).map_err(|_| Malformed("args.keys: bad group".into()))?;
        named.push((hash, group));
        cached.push(hit.and_then(|ids| ids.first().copied()).map_or(Json::Null, |b| Json::Int(b as i128)));
    }
    let mut fields = vec![("num_free", Json::Int(pool.get_num_free_blocks() as i128)),
                          ("writable", Json::Arr(writable)), ("cached", Json::Arr(cached))];
    if shown {
        let blocks: Vec<usize> = blocks.into_iter().map(|b| b as usize).collect();
        fields.push(("shown", pool.shown(&blocks, &named)));
    }
    Ok(obj(fields))
}

fn usage(code: i32) -> ! {
    eprintln!("usage: rust-pool [--observe] [--minimal] [--lacks NAMES] [--no-observe-lines] [--bug NAME]... \
               [--trivial]\n  bugs: {}",
              Bugs::NAMES.join(", "));
    std::process::exit(code)
}

fn main() {
    let mut bugs = Bugs::default();
    let (mut observe, mut trivial, mut observe_lines) = (false, false, true);
    let mut lacks = Lacks::default();
    let mut argv = std::env::args().skip(1);
    while let Some(arg) = argv.next() {
        match arg.as_str() {
            "--observe" => observe = true,
            "--trivial" => trivial = true,
            "--no-observe-lines" => observe_lines = false,
            "--minimal" => lacks.names.extend(MINIMAL.iter().map(|n| n.to_string())),
            "--lacks" => {
                let names = argv.next().unwrap_or_else(|| usage(2));
                lacks.names.extend(names.split([',', ' ']).filter(|n| !n.is_empty()).map(str::to_string));
            }
            "--bug" => {
                let name = argv.next().unwrap_or_else(|| usage(2));
                if !bugs.plant(&name) {
                    eprintln!("rust-pool: unknown bug {:?}", name);
                    usage(2);
                }
            }
            "-h" | "--help" => usage(0),
            _ => usage(2),
        }
    }
    let mut input = BufReader::with_capacity(1 << 16, io::stdin().lock());
    let mut out = BufWriter::new(io::stdout().lock());
    lacks.names.dedup();
    let mut server = Server { pool: None, bugs, observe, observe_lines, lacks, metrics: false, when_asked: false,
                              line: 0 };
    let mut raw = Vec::new();
    let mut text = String::new();
    loop {
        raw.clear();
        let read = input.read_until(b'\n', &mut raw).unwrap_or_else(|e| {
            eprintln!("rust-pool: cannot read stdin: {}", e);
            std::process::exit(1)
        });
        if read == 0 {
            break;
        }
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        text.clear();
        if trivial {
            text.push_str("{\"result\":null,\"error\":null,\"events\":[],\"fired\":[]}");
        } else {
            let answer = match std::str::from_utf8(&raw) {
                Ok(line) => server.answer(line),
                Err(_) => server.violation("not UTF-8"),
            };
            json::write_json(&answer, &mut text);
        }
        text.push('\n');
        // Answer at once when nothing more is waiting; else answer in one write later.
        if out.write_all(text.as_bytes()).is_err() || (input.buffer().is_empty() && out.flush().is_err()) {
            break; // kvpool went away: nothing left to answer
        }
    }
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::unhex;

    #[test]
    fn unhex_refuses_what_is_not_lowercase_hex() {
        assert_eq!(unhex("0aff"), Some(vec![0x0a, 0xff]));
        for bad in ["0", "0A", "zz", "aéb", "éa"] {
            assert_eq!(unhex(bad), None, "{}", bad);
        }
    }
}
