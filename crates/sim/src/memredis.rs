//! `MemRedis`: an in-memory Redis for the simulator, with an embedded Lua 5.1 (the Lua
//! Redis embeds) that runs the gate's own scripts.
//!
//! What it keeps of Redis: a keyspace of strings, hashes and sorted sets, each key with
//! its own expiry on Redis's clock (the simulated one, set before each call); `noeviction`
//! (nothing is ever dropped but by expiry or a command); a `run_id` per Redis process,
//! a new one after each restart or failover ([`MemRedis::restart`]); pub/sub messages
//! published by scripts, handed back to the caller to deliver. Exactly the commands the
//! scripts and the adapter's plain calls use, with their reply shapes and the argument
//! errors a script could observe.
//!
//! Scripts run as in Redis: atomically (nothing else runs until one returns), with no
//! rollback (an error part-way keeps the writes made before it), each compiled once per
//! interpreter, `KEYS` and `ARGV` set per call, `redis.call` / `redis.pcall` /
//! `redis.error_reply` / `redis.status_reply` with Redis's conversions between Lua values
//! and replies. Nothing a script can reach reads the wall clock or a random source: `TIME`
//! is the simulated clock, `math.random` is not loaded.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mlua::{
    Function, HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, Value as LuaValue, VmState,
};
use redis::Value;

/// Lua instructions one script may run before it is stopped with an error (Redis's
/// busy-script limit, as a count the simulation can't vary): the gate's largest call,
/// a reserve batch of 128, runs well under a million.
const SCRIPT_INSTRUCTIONS_MAX: u32 = 50_000_000;
/// How often (in instructions) the interpreter checks that limit.
const INSTRUCTION_CHECK_EVERY: u32 = 100_000;

/// A sorted-set score, ordered totally (Redis never stores NaN).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Score(f64);

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ZSet {
    scores: BTreeMap<Vec<u8>, Score>,
    ordered: BTreeSet<(Score, Vec<u8>)>,
}

impl ZSet {
    /// Adds or moves a member; whether it is new.
    fn add(&mut self, member: Vec<u8>, score: f64) -> bool {
        let score = Score(score);
        match self.scores.insert(member.clone(), score) {
            Some(old) => {
                self.ordered.remove(&(old, member.clone()));
                self.ordered.insert((score, member));
                false
            }
            None => {
                self.ordered.insert((score, member));
                true
            }
        }
    }

    fn remove(&mut self, member: &[u8]) -> bool {
        match self.scores.remove(member) {
            Some(score) => {
                self.ordered.remove(&(score, member.to_vec()));
                true
            }
            None => false,
        }
    }
}

/// A hash's fields.
type Hash = BTreeMap<Vec<u8>, Vec<u8>>;

/// A message PUBLISHed: channel, payload.
pub type Message = (Vec<u8>, Vec<u8>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Data {
    Str(Vec<u8>),
    Hash(Hash),
    ZSet(ZSet),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    data: Data,
    /// When the key expires (ms on Redis's clock); None: never.
    expires_ms: Option<i64>,
}

/// A Redis process's data: what a snapshot (an RDB file, a replica) holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keyspace {
    keys: BTreeMap<Vec<u8>, Entry>,
}

/// The server's state while a command or script runs.
#[derive(Debug, Default)]
struct Server {
    data: Keyspace,
    /// Redis's clock (ms), set by the caller before each call.
    now_ms: i64,
    run_id: String,
    /// Messages PUBLISHed during the current call: (channel, message).
    published: Vec<Message>,
}

/// Why a command failed: the error reply's text.
type CmdResult = Result<Value, String>;

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
const NOT_FLOAT: &str = "ERR value is not a valid float";
const SYNTAX: &str = "ERR syntax error";

fn arity(name: &str) -> String {
    format!(
        "ERR wrong number of arguments for '{}' command",
        name.to_lowercase()
    )
}

/// The error of a command given a wrong number of arguments, unless `ok`.
fn need(name: &str, ok: bool) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(arity(name))
    }
}

fn unknown(name: &str) -> String {
    format!("ERR unknown command '{name}'")
}

fn parse_int(arg: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| NOT_INTEGER.to_owned())
}

fn bulk(bytes: &[u8]) -> Value {
    Value::BulkString(bytes.to_vec())
}

/// A score as Redis prints it in a reply (integers without a fraction).
fn score_text(score: f64) -> Vec<u8> {
    if score.fract() == 0.0 && score.abs() < 1e17 {
        format!("{}", score as i64).into_bytes()
    } else {
        format!("{score}").into_bytes()
    }
}

/// A ZRANGEBYSCORE bound: `-inf`, `+inf`, `x` or `(x` (exclusive).
fn score_bound(arg: &[u8]) -> Result<(f64, bool), String> {
    let text = std::str::from_utf8(arg).map_err(|_| NOT_FLOAT.to_owned())?;
    let (text, exclusive) = match text.strip_prefix('(') {
        Some(rest) => (rest, true),
        None => (text, false),
    };
    let value = match text {
        "-inf" => f64::NEG_INFINITY,
        "+inf" | "inf" => f64::INFINITY,
        t => t
            .parse()
            .map_err(|_| "ERR min or max is not a float".to_owned())?,
    };
    Ok((value, exclusive))
}

/// Redis's glob match, for SCAN's MATCH: `*`, `?` and `\` escapes (the gate's patterns
/// use nothing else; a `[` class is taken literally).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|i| glob(rest, &text[i..])),
        Some((b'?', rest)) => !text.is_empty() && glob(rest, &text[1..]),
        Some((b'\\', rest)) if !rest.is_empty() => {
            text.first() == Some(&rest[0]) && glob(&rest[1..], &text[1..])
        }
        Some((c, rest)) => text.first() == Some(c) && glob(rest, &text[1..]),
    }
}

impl Server {
    /// The live entry under a key; an expired one is deleted first, as Redis does on
    /// access.
    fn live(&mut self, key: &[u8]) -> Option<&mut Entry> {
        let now = self.now_ms;
        if self
            .data
            .keys
            .get(key)
            .is_some_and(|e| e.expires_ms.is_some_and(|at| at <= now))
        {
            self.data.keys.remove(key);
        }
        self.data.keys.get_mut(key)
    }

    fn hash(&mut self, key: &[u8]) -> Result<Option<&mut Hash>, String> {
        match self.live(key) {
            None => Ok(None),
            Some(Entry {
                data: Data::Hash(h),
                ..
            }) => Ok(Some(h)),
            Some(_) => Err(WRONGTYPE.to_owned()),
        }
    }

    fn hash_or_new(&mut self, key: &[u8]) -> Result<&mut Hash, String> {
        if self.live(key).is_none() {
            self.data.keys.insert(
                key.to_vec(),
                Entry {
                    data: Data::Hash(BTreeMap::new()),
                    expires_ms: None,
                },
            );
        }
        self.hash(key)?.ok_or_else(|| WRONGTYPE.to_owned())
    }

    fn zset(&mut self, key: &[u8]) -> Result<Option<&mut ZSet>, String> {
        match self.live(key) {
            None => Ok(None),
            Some(Entry {
                data: Data::ZSet(z),
                ..
            }) => Ok(Some(z)),
            Some(_) => Err(WRONGTYPE.to_owned()),
        }
    }

    /// Deletes a key that became empty (Redis never keeps an empty hash or set).
    fn drop_if_empty(&mut self, key: &[u8]) {
        let empty = match self.data.keys.get(key).map(|e| &e.data) {
            Some(Data::Hash(h)) => h.is_empty(),
            Some(Data::ZSet(z)) => z.scores.is_empty(),
            _ => false,
        };
        if empty {
            self.data.keys.remove(key);
        }
    }

    /// Runs one command: its family's function runs it.
    fn command(&mut self, args: &[Vec<u8>]) -> CmdResult {
        let Some((name, args)) = args.split_first() else {
            return Err("ERR empty command".to_owned());
        };
        let name = String::from_utf8_lossy(name).to_uppercase();
        match name.as_str() {
            "DEL" | "EXISTS" | "PEXPIRE" | "SCAN" => self.keys_command(&name, args),
            "SET" => self.set(args),
            "GET" => self.get(args),
            "HGET" | "HMGET" | "HSET" | "HSETNX" | "HDEL" | "HINCRBY" => {
                self.hash_command(&name, args)
            }
            "ZADD" | "ZREM" | "ZCARD" => self.zset_command(&name, args),
            "ZRANGE" => self.zrange(args),
            "ZRANGEBYSCORE" => self.zrangebyscore(args),
            "TIME" | "INFO" | "PUBLISH" => self.server_command(&name, args),
            _ => Err(unknown(&name)),
        }
    }

    /// The commands on keys of any type: DEL, EXISTS, PEXPIRE, SCAN.
    fn keys_command(&mut self, name: &str, args: &[Vec<u8>]) -> CmdResult {
        match name {
            "DEL" | "EXISTS" => {
                need(name, !args.is_empty())?;
                let mut n = 0;
                for key in args {
                    if self.live(key).is_some() {
                        n += 1;
                        if name == "DEL" {
                            self.data.keys.remove(key);
                        }
                    }
                }
                Ok(Value::Int(n))
            }
            "PEXPIRE" => {
                need(name, args.len() == 2)?;
                let ms = parse_int(&args[1])?;
                let at = self.now_ms.saturating_add(ms);
                let now = self.now_ms;
                match self.live(&args[0]) {
                    None => Ok(Value::Int(0)),
                    Some(entry) => {
                        entry.expires_ms = Some(at);
                        if at <= now {
                            self.data.keys.remove(&args[0]);
                        }
                        Ok(Value::Int(1))
                    }
                }
            }
            "SCAN" => self.scan(args),
            _ => Err(unknown(name)),
        }
    }

    /// SCAN: one step returns every match (COUNT is a hint to Redis too) and ends the
    /// iteration: cursor 0.
    fn scan(&mut self, args: &[Vec<u8>]) -> CmdResult {
        need("SCAN", !args.is_empty())?;
        parse_int(&args[0])?;
        let mut pattern: Option<&[u8]> = None;
        let mut options = args[1..].iter();
        while let Some(option) = options.next() {
            let value = options.next().ok_or_else(|| SYNTAX.to_owned())?;
            if option.eq_ignore_ascii_case(b"MATCH") {
                pattern = Some(value);
            } else if option.eq_ignore_ascii_case(b"COUNT") {
                parse_int(value)?;
            } else {
                return Err(SYNTAX.to_owned());
            }
        }
        let now = self.now_ms;
        let keys: Vec<Value> = self
            .data
            .keys
            .iter()
            .filter(|(_, e)| e.expires_ms.is_none_or(|at| at > now))
            .filter(|(k, _)| pattern.is_none_or(|p| glob(p, k)))
            .map(|(k, _)| bulk(k))
            .collect();
        Ok(Value::Array(vec![bulk(b"0"), Value::Array(keys)]))
    }

    /// SET key value [PX ms | EX s]…: the string command that writes.
    fn set(&mut self, args: &[Vec<u8>]) -> CmdResult {
        need("SET", args.len() >= 2)?;
        let mut expires_ms = None;
        let mut options = args[2..].iter();
        while let Some(option) = options.next() {
            let option = String::from_utf8_lossy(option).to_uppercase();
            let ms = match option.as_str() {
                "PX" => 1,
                "EX" => 1000,
                _ => return Err(SYNTAX.to_owned()),
            };
            let n = parse_int(options.next().ok_or_else(|| SYNTAX.to_owned())?)?;
            if n <= 0 {
                return Err("ERR invalid expire time in 'set' command".to_owned());
            }
            expires_ms = Some(self.now_ms.saturating_add(n.saturating_mul(ms)));
        }
        self.data.keys.insert(
            args[0].clone(),
            Entry {
                data: Data::Str(args[1].clone()),
                expires_ms,
            },
        );
        Ok(Value::Okay)
    }

    /// GET key: a string's value (destock.lua's marker), nil without one.
    fn get(&mut self, args: &[Vec<u8>]) -> CmdResult {
        need("GET", args.len() == 1)?;
        match self.live(&args[0]).map(|e| &e.data) {
            None => Ok(Value::Nil),
            Some(Data::Str(v)) => Ok(bulk(v)),
            Some(_) => Err(WRONGTYPE.to_owned()),
        }
    }

    /// The hash commands: HGET, HMGET, HSET, HSETNX, HDEL, HINCRBY.
    fn hash_command(&mut self, name: &str, args: &[Vec<u8>]) -> CmdResult {
        match name {
            "HGET" => {
                need(name, args.len() == 2)?;
                Ok(self
                    .hash(&args[0])?
                    .and_then(|h| h.get(&args[1]))
                    .map_or(Value::Nil, |v| bulk(v)))
            }
            "HMGET" => {
                need(name, args.len() >= 2)?;
                let h = self.hash(&args[0])?;
                Ok(Value::Array(
                    args[1..]
                        .iter()
                        .map(|f| {
                            h.as_ref()
                                .and_then(|h| h.get(f))
                                .map_or(Value::Nil, |v| bulk(v))
                        })
                        .collect(),
                ))
            }
            "HSET" => {
                need(name, args.len() >= 3 && args.len() % 2 == 1)?;
                let h = self.hash_or_new(&args[0])?;
                let mut added = 0;
                for pair in args[1..].chunks(2) {
                    if h.insert(pair[0].clone(), pair[1].clone()).is_none() {
                        added += 1;
                    }
                }
                Ok(Value::Int(added))
            }
            "HSETNX" => {
                need(name, args.len() == 3)?;
                let h = self.hash_or_new(&args[0])?;
                if h.contains_key(&args[1]) {
                    return Ok(Value::Int(0));
                }
                h.insert(args[1].clone(), args[2].clone());
                Ok(Value::Int(1))
            }
            "HDEL" => {
                need(name, args.len() >= 2)?;
                let Some(h) = self.hash(&args[0])? else {
                    return Ok(Value::Int(0));
                };
                let removed = args[1..].iter().filter(|f| h.remove(*f).is_some()).count();
                self.drop_if_empty(&args[0]);
                Ok(Value::Int(removed as i64))
            }
            "HINCRBY" => self.hincrby(args),
            _ => Err(unknown(name)),
        }
    }

    fn hincrby(&mut self, args: &[Vec<u8>]) -> CmdResult {
        need("HINCRBY", args.len() == 3)?;
        let by = parse_int(&args[2])?;
        let h = self.hash_or_new(&args[0])?;
        let old = match h.get(&args[1]) {
            None => 0,
            Some(v) => parse_int(v).map_err(|_| "ERR hash value is not an integer".to_owned())?,
        };
        let new = old
            .checked_add(by)
            .ok_or_else(|| "ERR increment or decrement would overflow".to_owned())?;
        h.insert(args[1].clone(), new.to_string().into_bytes());
        Ok(Value::Int(new))
    }

    /// The sorted-set commands that write or count: ZADD, ZREM, ZCARD.
    fn zset_command(&mut self, name: &str, args: &[Vec<u8>]) -> CmdResult {
        match name {
            "ZADD" => {
                need(name, args.len() >= 3 && args.len() % 2 == 1)?;
                let mut pairs = Vec::with_capacity(args.len() / 2);
                for pair in args[1..].chunks(2) {
                    let score: f64 = std::str::from_utf8(&pair[0])
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .filter(|s: &f64| !s.is_nan())
                        .ok_or_else(|| NOT_FLOAT.to_owned())?;
                    pairs.push((score, pair[1].clone()));
                }
                if self.zset(&args[0])?.is_none() {
                    self.data.keys.insert(
                        args[0].clone(),
                        Entry {
                            data: Data::ZSet(ZSet::default()),
                            expires_ms: None,
                        },
                    );
                }
                let z = self.zset(&args[0])?.ok_or_else(|| WRONGTYPE.to_owned())?;
                let added = pairs
                    .into_iter()
                    .filter(|(score, member)| z.add(member.clone(), *score))
                    .count();
                Ok(Value::Int(added as i64))
            }
            "ZREM" => {
                need(name, args.len() >= 2)?;
                let Some(z) = self.zset(&args[0])? else {
                    return Ok(Value::Int(0));
                };
                let removed = args[1..].iter().filter(|m| z.remove(m)).count();
                self.drop_if_empty(&args[0]);
                Ok(Value::Int(removed as i64))
            }
            "ZCARD" => {
                need(name, args.len() == 1)?;
                Ok(Value::Int(
                    self.zset(&args[0])?.map_or(0, |z| z.scores.len() as i64),
                ))
            }
            _ => Err(unknown(name)),
        }
    }

    /// ZRANGE key start stop [WITHSCORES], by rank.
    fn zrange(&mut self, args: &[Vec<u8>]) -> CmdResult {
        need("ZRANGE", args.len() == 3 || args.len() == 4)?;
        let with_scores = match args.get(3) {
            None => false,
            Some(o) if o.eq_ignore_ascii_case(b"WITHSCORES") => true,
            Some(_) => return Err(SYNTAX.to_owned()),
        };
        let (start, stop) = (parse_int(&args[1])?, parse_int(&args[2])?);
        let Some(z) = self.zset(&args[0])? else {
            return Ok(Value::Array(Vec::new()));
        };
        let len = z.scores.len() as i64;
        let start = if start < 0 {
            (len + start).max(0)
        } else {
            start
        };
        let stop = if stop < 0 {
            len + stop
        } else {
            stop.min(len - 1)
        };
        let mut out = Vec::new();
        if start <= stop {
            for (score, member) in z
                .ordered
                .iter()
                .skip(start as usize)
                .take((stop - start + 1) as usize)
            {
                out.push(bulk(member));
                if with_scores {
                    out.push(bulk(&score_text(score.0)));
                }
            }
        }
        Ok(Value::Array(out))
    }

    /// ZRANGEBYSCORE key min max [LIMIT offset count].
    fn zrangebyscore(&mut self, args: &[Vec<u8>]) -> CmdResult {
        need("ZRANGEBYSCORE", args.len() == 3 || args.len() == 6)?;
        let (min, min_ex) = score_bound(&args[1])?;
        let (max, max_ex) = score_bound(&args[2])?;
        let (offset, count) = if args.len() == 6 {
            if !args[3].eq_ignore_ascii_case(b"LIMIT") {
                return Err(SYNTAX.to_owned());
            }
            (parse_int(&args[4])?, parse_int(&args[5])?)
        } else {
            (0, -1)
        };
        let Some(z) = self.zset(&args[0])? else {
            return Ok(Value::Array(Vec::new()));
        };
        let inside = z.ordered.iter().filter(|(Score(s), _)| {
            (if min_ex { *s > min } else { *s >= min })
                && (if max_ex { *s < max } else { *s <= max })
        });
        let taken: Vec<Value> = inside
            .skip(offset.max(0) as usize)
            .take(if count < 0 {
                usize::MAX
            } else {
                count as usize
            })
            .map(|(_, m)| bulk(m))
            .collect();
        Ok(Value::Array(taken))
    }

    /// The server's commands: TIME, INFO, PUBLISH.
    fn server_command(&mut self, name: &str, args: &[Vec<u8>]) -> CmdResult {
        match name {
            "TIME" => {
                need(name, args.is_empty())?;
                let secs = self.now_ms.div_euclid(1000);
                let micros = self.now_ms.rem_euclid(1000) * 1000;
                Ok(Value::Array(vec![
                    bulk(secs.to_string().as_bytes()),
                    bulk(micros.to_string().as_bytes()),
                ]))
            }
            "INFO" => {
                // The sections the scripts read, each named or all when none is; a
                // process's replication id is its run_id here (one never replicates).
                let sections: Vec<String> = args
                    .iter()
                    .map(|s| String::from_utf8_lossy(s).to_lowercase())
                    .collect();
                let wanted = |name: &str| sections.is_empty() || sections.iter().any(|s| s == name);
                let mut text = String::new();
                if wanted("server") {
                    text.push_str(&format!("# Server\r\nrun_id:{}\r\n\r\n", self.run_id));
                }
                if wanted("replication") {
                    text.push_str(&format!(
                        "# Replication\r\nrole:master\r\nmaster_replid:{}\r\n\r\n",
                        self.run_id
                    ));
                }
                if wanted("memory") {
                    text.push_str("# Memory\r\nmaxmemory_policy:noeviction\r\n\r\n");
                }
                Ok(bulk(text.as_bytes()))
            }
            "PUBLISH" => {
                need(name, args.len() == 2)?;
                self.published.push((args[0].clone(), args[1].clone()));
                // Receivers are counted by the deliverer; scripts ignore the count.
                Ok(Value::Int(0))
            }
            _ => Err(unknown(name)),
        }
    }
}

/// Lua's view of a reply (`redis.call`'s return value).
fn to_lua(lua: &Lua, value: Value) -> mlua::Result<LuaValue> {
    Ok(match value {
        Value::Nil => LuaValue::Boolean(false),
        Value::Int(n) => LuaValue::Number(n as f64),
        Value::BulkString(b) => LuaValue::String(lua.create_string(&b)?),
        Value::SimpleString(s) => {
            let t = lua.create_table()?;
            t.raw_set("ok", s)?;
            LuaValue::Table(t)
        }
        Value::Okay => {
            let t = lua.create_table()?;
            t.raw_set("ok", "OK")?;
            LuaValue::Table(t)
        }
        Value::Array(items) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.into_iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            LuaValue::Table(t)
        }
        other => {
            return Err(mlua::Error::RuntimeError(format!(
                "the simulated Redis has no Lua form for {other:?}"
            )))
        }
    })
}

/// A script's return value as the reply Redis sends; an `{err = ...}` table is an error.
fn from_lua(value: LuaValue) -> CmdResult {
    Ok(match value {
        LuaValue::Nil | LuaValue::Boolean(false) => Value::Nil,
        LuaValue::Boolean(true) => Value::Int(1),
        LuaValue::Integer(n) => Value::Int(n),
        // Redis truncates a Lua number to an integer reply.
        LuaValue::Number(n) => Value::Int(n as i64),
        LuaValue::String(s) => Value::BulkString(s.as_bytes().to_vec()),
        LuaValue::Table(t) => {
            if let Ok(LuaValue::String(e)) = t.raw_get::<LuaValue>("err") {
                return Err(e.to_string_lossy());
            }
            if let Ok(LuaValue::String(ok)) = t.raw_get::<LuaValue>("ok") {
                return Ok(Value::SimpleString(ok.to_string_lossy()));
            }
            // An array up to the first nil.
            let mut items = Vec::new();
            for i in 1.. {
                match t.raw_get::<LuaValue>(i) {
                    Ok(LuaValue::Nil) | Err(_) => break,
                    Ok(v) => items.push(from_lua(v)?),
                }
            }
            Value::Array(items)
        }
        _ => Value::Nil,
    })
}

/// A command argument from Lua: a string, or a number as Redis formats it.
fn arg_bytes(value: &LuaValue) -> Option<Vec<u8>> {
    match value {
        LuaValue::String(s) => Some(s.as_bytes().to_vec()),
        LuaValue::Integer(n) => Some(n.to_string().into_bytes()),
        LuaValue::Number(n) => Some(score_text(*n)),
        _ => None,
    }
}

/// The Lua side of `redis.*`: `redis.call` raises the `{err = ...}` table `redis.pcall`
/// returns; a script's error, raised or returned, comes back as that table.
const PRELUDE: &str = r#"
local pcall_command = ...
redis = {}
function redis.pcall(...) return pcall_command(...) end
function redis.call(...)
  local reply = pcall_command(...)
  if type(reply) == 'table' and reply.err ~= nil then error(reply, 0) end
  return reply
end
function redis.error_reply(msg) return {err = msg} end
function redis.status_reply(msg) return {ok = msg} end
return function(script)
  local ok, reply = pcall(script)
  if ok then return reply end
  if type(reply) == 'table' and reply.err ~= nil then return reply end
  return {err = 'ERR user_script: ' .. tostring(reply)}
end
"#;

/// A Lua interpreter with the scripts loaded, and the server its `redis.call` reaches.
struct Interp {
    server: Arc<Mutex<Server>>,
    /// Instruction checks the running script has passed (see [`SCRIPT_INSTRUCTIONS_MAX`]).
    checks: Arc<AtomicU32>,
    lua: Lua,
    /// Runs a compiled script under pcall, mapping its error to an error reply.
    runner: Function,
    /// Compiled scripts, by id ([`MemRedis::script_load`]).
    scripts: Vec<Function>,
    /// Ids of scripts already loaded, by source (loading is once per text).
    loaded: HashMap<String, usize>,
}

/// A script loaded into a [`MemRedis`] (what Redis names by its SHA1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScriptId(usize);

fn lua_error(e: mlua::Error) -> String {
    format!("ERR the simulated Redis's Lua failed: {e}")
}

/// Interpreters a thread keeps for its next runs: starting Lua and compiling the scripts
/// again for every seed cost about a tenth of a seed's time; one per thread suffices (a
/// thread runs one seed at a time), a few cover tests that hold several.
const SPARE_MAX: usize = 4;

thread_local! {
    static SPARE: std::cell::RefCell<Vec<Interp>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A Redis: its keyspace, its process identity, and a Lua interpreter with the scripts
/// loaded.
pub struct MemRedis {
    /// Always there until the drop, which hands it to the thread's spares.
    interp: Option<Interp>,
    /// How many Redis processes there were: names the current one's run_id.
    process: u64,
}

impl Drop for MemRedis {
    fn drop(&mut self) {
        if let Some(interp) = self.interp.take() {
            SPARE.with(|spare| {
                let mut spare = spare.borrow_mut();
                if spare.len() < SPARE_MAX {
                    spare.push(interp);
                }
            });
        }
    }
}

impl Interp {
    fn new() -> Result<Self, String> {
        // Redis loads base, table, string, math (and a few more the scripts don't use);
        // `math.random` is removed below, so nothing random reaches a script.
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::default(),
        )
        .map_err(lua_error)?;
        let server = Arc::new(Mutex::new(Server::default()));
        let shared = server.clone();
        let pcall_command = lua
            .create_function(move |lua, args: MultiValue| {
                let mut argv = Vec::with_capacity(args.len());
                for arg in args.iter() {
                    match arg_bytes(arg) {
                        Some(bytes) => argv.push(bytes),
                        None => {
                            let t = lua.create_table()?;
                            t.raw_set(
                                "err",
                                "ERR Lua redis lib command arguments must be strings or integers",
                            )?;
                            return Ok(LuaValue::Table(t));
                        }
                    }
                }
                let reply = shared
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .command(&argv);
                match reply {
                    Ok(value) => to_lua(lua, value),
                    Err(e) => {
                        let t = lua.create_table()?;
                        t.raw_set("err", e)?;
                        Ok(LuaValue::Table(t))
                    }
                }
            })
            .map_err(lua_error)?;
        let runner: Function = lua
            .load(PRELUDE)
            .set_name("=prelude")
            .call(pcall_command)
            .map_err(lua_error)?;
        let math: Table = lua.globals().get("math").map_err(lua_error)?;
        math.raw_set("random", LuaValue::Nil).map_err(lua_error)?;
        math.raw_set("randomseed", LuaValue::Nil)
            .map_err(lua_error)?;
        let checks = Arc::new(AtomicU32::new(0));
        let counted = checks.clone();
        lua.set_hook(
            HookTriggers::new().every_nth_instruction(INSTRUCTION_CHECK_EVERY),
            move |_, _| {
                if counted.fetch_add(1, Ordering::Relaxed) + 1
                    >= SCRIPT_INSTRUCTIONS_MAX / INSTRUCTION_CHECK_EVERY
                {
                    return Err(mlua::Error::RuntimeError(format!(
                        "BUSY the script ran {SCRIPT_INSTRUCTIONS_MAX} instructions"
                    )));
                }
                Ok(VmState::Continue)
            },
        )
        .map_err(lua_error)?;
        Ok(Self {
            checks,
            server,
            lua,
            runner,
            scripts: Vec::new(),
            loaded: HashMap::new(),
        })
    }
}

impl MemRedis {
    /// A Redis with no keys, its first process running; the interpreter is a spare of
    /// this thread's if there is one (the scripts it compiled stay loaded: nothing of a
    /// run but the keyspace, which starts empty, reaches the next).
    pub fn new() -> Result<Self, String> {
        let interp = match SPARE.with(|spare| spare.borrow_mut().pop()) {
            Some(interp) => interp,
            None => Interp::new()?,
        };
        *interp.server.lock().unwrap_or_else(|p| p.into_inner()) = Server::default();
        let mut redis = Self {
            interp: Some(interp),
            process: 0,
        };
        redis.restart(Keyspace::default());
        Ok(redis)
    }

    #[allow(
        clippy::expect_used,
        reason = "the interpreter is taken only by the drop"
    )]
    fn interp(&self) -> &Interp {
        self.interp
            .as_ref()
            .expect("the interpreter stays until the drop")
    }

    fn lock(&self) -> MutexGuard<'_, Server> {
        self.interp()
            .server
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// A new Redis process serving `data` (empty after a restart that lost everything, a
    /// snapshot after a failover): a new run_id.
    pub fn restart(&mut self, data: Keyspace) {
        self.process += 1;
        let mut server = self.lock();
        server.data = data;
        server.run_id = format!("{:040x}", self.process);
    }

    /// A copy of the data (a replica's or a snapshot's).
    pub fn snapshot(&self) -> Keyspace {
        self.lock().data.clone()
    }

    /// Compiles a script once (SCRIPT LOAD); the same text again gets the same id.
    pub fn script_load(&mut self, source: &str) -> Result<ScriptId, String> {
        let interp = self
            .interp
            .as_mut()
            .ok_or("ERR the interpreter is gone (taken only by the drop)")?;
        if let Some(&id) = interp.loaded.get(source) {
            return Ok(ScriptId(id));
        }
        let function = interp
            .lua
            .load(source)
            .set_name("=user_script")
            .into_function()
            .map_err(|e| format!("ERR Error compiling script: {e}"))?;
        interp.scripts.push(function);
        let id = interp.scripts.len() - 1;
        interp.loaded.insert(source.to_owned(), id);
        Ok(ScriptId(id))
    }

    /// Runs a plain command at `now_ms` on Redis's clock.
    pub fn command(&self, now_ms: i64, args: &[String]) -> CmdResult {
        let mut server = self.lock();
        server.now_ms = now_ms;
        let args: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
        server.command(&args)
    }

    /// HGET without building a command, and without touching the keyspace (an expired
    /// key reads as absent and stays until its next access): the simulator's check after
    /// every step.
    pub fn peek_hget(&self, now_ms: i64, key: &[u8], field: &[u8]) -> Option<Vec<u8>> {
        let server = self.lock();
        let entry = server.data.keys.get(key)?;
        if entry.expires_ms.is_some_and(|at| at <= now_ms) {
            return None;
        }
        match &entry.data {
            Data::Hash(h) => h.get(field).cloned(),
            _ => None,
        }
    }

    /// Runs a loaded script atomically at `now_ms`; its reply, and the messages it
    /// published (channel, message) for the caller to deliver.
    pub fn eval(
        &self,
        now_ms: i64,
        script: ScriptId,
        keys: &[String],
        args: &[String],
    ) -> (CmdResult, Vec<Message>) {
        {
            let mut server = self.lock();
            server.now_ms = now_ms;
            server.published.clear();
        }
        let reply = self.run(script, keys, args);
        let published = std::mem::take(&mut self.lock().published);
        (reply, published)
    }

    fn run(&self, script: ScriptId, keys: &[String], args: &[String]) -> CmdResult {
        let interp = self.interp();
        let function = interp
            .scripts
            .get(script.0)
            .ok_or_else(|| "NOSCRIPT No matching script".to_owned())?;
        let strings = |items: &[String]| -> mlua::Result<Table> {
            let t = interp.lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, item.as_str())?;
            }
            Ok(t)
        };
        let globals = interp.lua.globals();
        globals
            .raw_set("KEYS", strings(keys).map_err(lua_error)?)
            .map_err(lua_error)?;
        globals
            .raw_set("ARGV", strings(args).map_err(lua_error)?)
            .map_err(lua_error)?;
        interp.checks.store(0, Ordering::Relaxed);
        let reply: LuaValue = interp.runner.call(function).map_err(lua_error)?;
        from_lua(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    // Checks Redis's conversions both ways through a script: a command's nil comes in as
    // false, integers as numbers and go back truncated, a table goes back as an array up
    // to its first nil, true as 1, a status reply as {ok=...}, and an error reply (a
    // WRONGTYPE from redis.call) ends the script with that error — keeping the write it
    // made before (no rollback). redis.pcall hands the error back as {err=...}.
    #[test]
    fn conversions_and_errors_are_redis_s() {
        let mut r = MemRedis::new().expect("lua");
        let script = r
            .script_load(
                "local miss = redis.call('HGET', KEYS[1], 'f')
                 local set = redis.call('SET', KEYS[2], 'v')
                 return {miss == false and 1 or 0, 3.9, true, set.ok, 'x', nil, 'after'}",
            )
            .expect("compiles");
        let (reply, _) = r.eval(0, script, &strings(&["h", "s"]), &[]);
        assert_eq!(
            reply,
            Ok(Value::Array(vec![
                Value::Int(1),
                Value::Int(3),
                Value::Int(1),
                Value::BulkString(b"OK".to_vec()),
                Value::BulkString(b"x".to_vec()),
            ]))
        );
        let failing = r
            .script_load(
                "redis.call('HSET', KEYS[1], 'a', '1')
                 local e = redis.pcall('HGET', KEYS[2], 'f')
                 if not e.err then return 'no error' end
                 redis.call('HGET', KEYS[2], 'f')
                 return 'unreached'",
            )
            .expect("compiles");
        let (reply, _) = r.eval(0, failing, &strings(&["h2", "s"]), &[]);
        assert_eq!(reply, Err(WRONGTYPE.to_owned()));
        assert_eq!(
            r.command(0, &strings(&["HGET", "h2", "a"])),
            Ok(Value::BulkString(b"1".to_vec())),
            "the write before the error stays"
        );
        let replied = r
            .script_load("return redis.error_reply('ERR mine')")
            .expect("compiles");
        assert_eq!(r.eval(0, replied, &[], &[]).0, Err("ERR mine".to_owned()));
    }

    // Checks expiry on the clock given with each call: a record set to live 100 ms is
    // there at 99 ms and gone at 100 ms, for a script's HGET and for SCAN alike; and that
    // a restart names a new process in INFO while a snapshot restores the data.
    #[test]
    fn keys_expire_on_the_given_clock_and_restarts_change_the_run_id() {
        let mut r = MemRedis::new().expect("lua");
        let cmd = |r: &MemRedis, at: i64, args: &[&str]| r.command(at, &strings(args));
        assert_eq!(cmd(&r, 0, &["HSET", "k", "f", "v"]), Ok(Value::Int(1)));
        assert_eq!(cmd(&r, 0, &["PEXPIRE", "k", "100"]), Ok(Value::Int(1)));
        assert_eq!(
            cmd(&r, 99, &["HGET", "k", "f"]),
            Ok(Value::BulkString(b"v".to_vec()))
        );
        let scan = |r: &MemRedis, at| cmd(r, at, &["SCAN", "0", "MATCH", "k*", "COUNT", "10"]);
        assert_eq!(
            scan(&r, 99),
            Ok(Value::Array(vec![
                Value::BulkString(b"0".to_vec()),
                Value::Array(vec![Value::BulkString(b"k".to_vec())])
            ]))
        );
        assert_eq!(cmd(&r, 100, &["HGET", "k", "f"]), Ok(Value::Nil));
        let info = |r: &MemRedis| match cmd(r, 0, &["INFO", "server"]) {
            Ok(Value::BulkString(b)) => String::from_utf8(b).expect("utf-8"),
            other => panic!("INFO answered {other:?}"),
        };
        let first = info(&r);
        assert_eq!(cmd(&r, 0, &["SET", "s", "1"]), Ok(Value::Okay));
        let copy = r.snapshot();
        assert_eq!(cmd(&r, 0, &["DEL", "s"]), Ok(Value::Int(1)));
        r.restart(copy);
        assert_ne!(info(&r), first);
        assert_eq!(cmd(&r, 0, &["EXISTS", "s"]), Ok(Value::Int(1)));
    }

    // Checks the sorted-set commands the gate uses: ZADD counts new members only,
    // ZRANGEBYSCORE honours an exclusive bound and LIMIT, ZRANGE WITHSCORES prints whole
    // scores without a fraction, and ZREM of the last member deletes the key.
    #[test]
    fn sorted_sets_answer_as_redis_does() {
        let r = MemRedis::new().expect("lua");
        let cmd = |args: &[&str]| r.command(0, &strings(args));
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(cmd(&["ZADD", "z", "5", "a", "3", "b"]), Ok(Value::Int(2)));
        assert_eq!(cmd(&["ZADD", "z", "7", "a"]), Ok(Value::Int(0)));
        assert_eq!(
            cmd(&["ZRANGEBYSCORE", "z", "-inf", "(7", "LIMIT", "0", "10"]),
            Ok(Value::Array(vec![b("b")]))
        );
        assert_eq!(
            cmd(&["ZRANGE", "z", "0", "-1", "WITHSCORES"]),
            Ok(Value::Array(vec![b("b"), b("3"), b("a"), b("7")]))
        );
        assert_eq!(cmd(&["ZREM", "z", "a", "b", "c"]), Ok(Value::Int(2)));
        assert_eq!(cmd(&["EXISTS", "z"]), Ok(Value::Int(0)));
    }
}
