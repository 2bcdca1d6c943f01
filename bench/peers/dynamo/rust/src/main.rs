//! dynamo-peer runs one kvroute peer-comparison workload file against
//! `dynamo_kv_router::RadixTree` (the single-threaded compressed radix tree
//! of dynamo-kv-router) and prints the timings of every section as one JSON
//! object on stdout.
//!
//! Usage: dynamo-peer WORKLOAD [-out DIGESTS] [-passes N]
//!
//! The workload format is defined in ../format.go (all integers
//! little-endian). Everything is decoded and materialised into the crate's
//! own types before a section's clock starts; the clock covers only the
//! calls into the crate (apply_event, find_matches, hashing) and folding
//! each answer into a 64-bit digest that the Go driver checks against the
//! ground truth. With -out, the digests are written to DIGESTS.
//!
//! With -passes N, the whole workload runs N times, each pass on a new
//! tree and from freshly decoded events (decoding and dropping the last
//! pass's tree are outside the clock): a section's timings are the sums
//! over the passes, its errors those of the first, and every pass must
//! answer as the first did.

use std::fmt::Write as _;
use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use dynamo_kv_router::RadixTree;
use dynamo_kv_router::protocols::{
    BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData,
    KvCacheRemoveData, KvCacheStoreData, KvCacheStoredBlockData, LocalBlockHash, OverlapScores,
    RouterEvent, compute_block_hash_for_seq, compute_seq_hash_for_block,
};

const MAGIC: &[u8; 8] = b"KVPEER01";
const RESULT_MAGIC: &[u8; 8] = b"KVPRES01";

const OP_STORED: u8 = 1;
const OP_REMOVED: u8 = 2;
const OP_QUERY: u8 = 3;
const OP_HASH: u8 = 4;

/// Number of queries per section whose full scores are printed.
const SAMPLES: usize = 3;

/// splitmix64's finaliser; the Go side uses the same function.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d049bb133111eb);
    x ^ (x >> 31)
}

/// Order-independent digest of one query's overlap scores: the wrapping sum
/// of mix(worker * golden ^ score) over the workers with a non-zero score.
fn score_digest(s: &OverlapScores) -> u64 {
    let mut d = 0u64;
    for (w, &score) in &s.scores {
        if score > 0 {
            d = d.wrapping_add(mix(
                w.worker_id.wrapping_mul(0x9e3779b97f4a7c15) ^ u64::from(score),
            ));
        }
    }
    d
}

/// Digest of one chained hashing: mix(last sequence hash) plus the count.
fn hash_digest(seqs: &[u64]) -> u64 {
    match seqs.last() {
        Some(&last) => mix(last).wrapping_add(seqs.len() as u64),
        None => 0,
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.buf.len() - self.pos < n {
            return Err(format!("truncated at byte {}", self.pos));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn len(&mut self, elem: usize) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n.saturating_mul(elem) > self.buf.len() - self.pos {
            return Err(format!("length {n} at byte {} exceeds the file", self.pos));
        }
        Ok(n)
    }
}

/// One decoded operation, before materialisation.
enum Op {
    Event(RouterEvent),
    Query(Vec<LocalBlockHash>),
    Hash(Vec<u32>),
}

struct Section {
    name: String,
    timed: bool,
    repeat: u32,
    ops: Vec<Op>,
}

fn decode(buf: &[u8]) -> Result<(u32, Vec<Section>), String> {
    let mut r = Reader { buf, pos: 0 };
    if r.take(8)? != MAGIC {
        return Err("not a kvroute peer workload (bad magic)".into());
    }
    let block_size = r.u32()?;
    let n_sections = r.u32()?;
    let mut sections = Vec::new();
    for _ in 0..n_sections {
        let name_len = r.u16()? as usize;
        let name = String::from_utf8(r.take(name_len)?.to_vec()).map_err(|e| e.to_string())?;
        let flags = r.u8()?;
        let _metric = r.u8()?;
        let repeat = r.u32()?.max(1);
        let n_ops = r.u64()?;
        let mut ops = Vec::new();
        for _ in 0..n_ops {
            let kind = r.u8()?;
            let op = match kind {
                OP_STORED => {
                    let worker = r.u64()?;
                    let event_id = r.u64()?;
                    let has_parent = r.u8()? != 0;
                    let parent = r.u64()?;
                    let n = r.len(16)?;
                    let mut blocks = Vec::with_capacity(n);
                    for _ in 0..n {
                        let local = r.u64()?;
                        let ext = r.u64()?;
                        blocks.push(KvCacheStoredBlockData {
                            block_hash: ExternalSequenceBlockHash(ext),
                            tokens_hash: LocalBlockHash(local),
                            mm_extra_info: None,
                        });
                    }
                    Op::Event(RouterEvent::new(
                        worker,
                        KvCacheEvent {
                            event_id,
                            data: KvCacheEventData::Stored(KvCacheStoreData {
                                parent_hash: has_parent.then_some(ExternalSequenceBlockHash(parent)),
                                start_position: None,
                                blocks,
                            }),
                            dp_rank: 0,
                        },
                    ))
                }
                OP_REMOVED => {
                    let worker = r.u64()?;
                    let event_id = r.u64()?;
                    let n = r.len(8)?;
                    let mut hashes = Vec::with_capacity(n);
                    for _ in 0..n {
                        hashes.push(ExternalSequenceBlockHash(r.u64()?));
                    }
                    Op::Event(RouterEvent::new(
                        worker,
                        KvCacheEvent {
                            event_id,
                            data: KvCacheEventData::Removed(KvCacheRemoveData {
                                block_hashes: hashes,
                            }),
                            dp_rank: 0,
                        },
                    ))
                }
                OP_QUERY => {
                    let n = r.len(16)?;
                    let mut locals = Vec::with_capacity(n);
                    for _ in 0..n {
                        locals.push(LocalBlockHash(r.u64()?));
                    }
                    r.take(n * 8)?; // the chained hashes are kvroute's input
                    let k = r.len(12)?;
                    r.take(k * 12)?; // expected scores: checked by the driver
                    Op::Query(locals)
                }
                OP_HASH => {
                    let n = r.len(4)?;
                    let mut tokens = Vec::with_capacity(n);
                    for _ in 0..n {
                        tokens.push(r.u32()?);
                    }
                    r.u64()?; // expected digest: checked by the driver
                    Op::Hash(tokens)
                }
                k => return Err(format!("unknown op kind {k} at byte {}", r.pos - 1)),
            };
            ops.push(op);
        }
        let has_events = ops.iter().any(|op| matches!(op, Op::Event(_)));
        if repeat > 1 && has_events {
            return Err(format!("section {name}: events cannot be repeated"));
        }
        sections.push(Section {
            name,
            timed: flags & 1 != 0,
            repeat,
            ops,
        });
    }
    if r.pos != buf.len() {
        return Err(format!("{} trailing bytes", buf.len() - r.pos));
    }
    Ok((block_size, sections))
}

/// An operation ready to run: owned inputs that the crate's API consumes,
/// so the timed loop only moves them.
enum Ready {
    /// The event, and its blocks when it is a Stored event (else 0).
    Event(RouterEvent, u64),
    /// Local hashes, result slot, whether to keep the full scores.
    Query(Vec<LocalBlockHash>, usize, bool),
    /// Index of the token sequence, result slot.
    Hash(usize, usize),
}

/// The CPU time this process has used, all threads, in nanoseconds
/// (`clock_gettime(CLOCK_PROCESS_CPUTIME_ID)` from the C library the
/// standard library links), or None where it is not read.
#[cfg(all(any(target_os = "linux", target_os = "macos"), target_pointer_width = "64"))]
fn process_cpu_ns() -> Option<u128> {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_PROCESS_CPUTIME_ID: i32 = if cfg!(target_os = "macos") { 12 } else { 2 };
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: ts is a valid, writable timespec for the call to fill.
    if unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut ts) } != 0 {
        return None;
    }
    Some(ts.sec as u128 * 1_000_000_000 + ts.nsec as u128)
}

#[cfg(not(all(any(target_os = "linux", target_os = "macos"), target_pointer_width = "64")))]
fn process_cpu_ns() -> Option<u128> {
    None
}

struct SectionResult {
    name: String,
    timed: bool,
    ops: u64,
    block_ops: u64,
    ns: u128,
    /// The process's CPU time over the section (0: not available).
    cpu_ns: u128,
    errors: u64,
    /// The blocks of the Stored events among the errors: work the tree
    /// skipped.
    rejected_stored_blocks: u64,
    digests: Vec<u64>,
    samples: Vec<Vec<(u64, u32)>>,
}

fn run_section(tree: &mut RadixTree, block_size: u32, sec: Section) -> SectionResult {
    let Section {
        name,
        timed,
        repeat,
        ops: decoded,
    } = sec;
    let repeat = repeat as usize;
    let mut tokens: Vec<Vec<u32>> = Vec::new();
    let mut once = Vec::with_capacity(decoded.len());
    let mut block_ops = 0u64;
    let mut slots = 0usize;
    for op in decoded {
        match op {
            Op::Event(ev) => {
                let (ops, stored) = match &ev.event.data {
                    KvCacheEventData::Stored(s) => (s.blocks.len() as u64, s.blocks.len() as u64),
                    KvCacheEventData::Removed(r) => (r.block_hashes.len() as u64, 0),
                    KvCacheEventData::Cleared => (1, 0),
                };
                block_ops += ops;
                once.push(Ready::Event(ev, stored));
            }
            Op::Query(locals) => {
                block_ops += locals.len() as u64;
                once.push(Ready::Query(locals, slots, slots < SAMPLES));
                slots += 1;
            }
            Op::Hash(t) => {
                block_ops += 1;
                tokens.push(t);
                once.push(Ready::Hash(tokens.len() - 1, slots));
                slots += 1;
            }
        }
    }
    // Every pass but the last runs clones of the queries (decode rejects
    // repeated events); only the first pass keeps samples.
    let mut ready = Vec::with_capacity(once.len() * repeat);
    for pass in 0..repeat - 1 {
        for r in &once {
            ready.push(match r {
                Ready::Query(l, s, sample) => Ready::Query(l.clone(), *s, *sample && pass == 0),
                Ready::Hash(i, s) => Ready::Hash(*i, *s),
                Ready::Event(..) => unreachable!("decode rejects repeated events"),
            });
        }
    }
    ready.extend(once.into_iter().map(|r| match r {
        Ready::Query(l, s, sample) => Ready::Query(l, s, sample && repeat == 1),
        r => r,
    }));
    let ops = ready.len() as u64;
    block_ops *= repeat as u64;
    let mut digests = vec![0u64; slots];
    let mut samples = Vec::new();
    let mut errors = 0u64;
    let mut rejected_stored_blocks = 0u64;
    let options = BlockHashOptions::default();

    let cpu_start = process_cpu_ns();
    let start = Instant::now();
    for op in ready {
        match op {
            Ready::Event(ev, stored) => {
                if tree.apply_event(ev).is_err() {
                    errors += 1;
                    rejected_stored_blocks += stored;
                }
            }
            Ready::Query(locals, slot, sample) => {
                let scores = tree.find_matches(locals, false);
                if sample {
                    let mut s: Vec<(u64, u32)> = scores
                        .scores
                        .iter()
                        .filter(|(_, v)| **v > 0)
                        .map(|(w, v)| (w.worker_id, *v))
                        .collect();
                    s.sort_unstable();
                    samples.push(s);
                }
                digests[slot] = score_digest(&scores);
            }
            Ready::Hash(i, slot) => {
                let locals = compute_block_hash_for_seq(black_box(&tokens[i]), block_size, options);
                let seqs = compute_seq_hash_for_block(&locals);
                digests[slot] = hash_digest(&seqs);
            }
        }
    }
    let ns = start.elapsed().as_nanos();
    let cpu_ns = match (cpu_start, process_cpu_ns()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    black_box(&digests);

    SectionResult {
        name,
        timed,
        ops,
        block_ops,
        ns,
        cpu_ns,
        errors,
        rejected_stored_blocks,
        digests,
        samples,
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => write!(out, "\\u{:04x}", c as u32).unwrap(),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut input = None;
    let mut out = None;
    let mut passes = 1usize;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "-out" | "--out" => {
                i += 1;
                out = Some(args.get(i).ok_or("-out needs a path")?.clone());
            }
            "-passes" | "--passes" => {
                i += 1;
                passes = args
                    .get(i)
                    .ok_or("-passes needs a count")?
                    .parse()
                    .map_err(|e| format!("-passes: {e}"))?;
                if passes == 0 {
                    return Err("-passes must be at least 1".into());
                }
            }
            a if input.is_none() && !a.starts_with('-') => input = Some(a.to_string()),
            a => return Err(format!("unexpected argument {a:?}")),
        }
        i += 1;
    }
    let input = input.ok_or("usage: dynamo-peer WORKLOAD [-out DIGESTS] [-passes N]")?;
    let buf = std::fs::read(&input).map_err(|e| format!("{input}: {e}"))?;

    let mut results: Vec<SectionResult> = Vec::new();
    let mut tree = RadixTree::new();
    for pass in 0..passes {
        let (block_size, sections) = decode(&buf).map_err(|e| format!("{input}: {e}"))?;
        if pass > 0 {
            // The last pass's tree goes away outside the clock.
            tree = RadixTree::new();
        }
        for (k, sec) in sections.into_iter().enumerate() {
            let r = run_section(&mut tree, block_size, sec);
            if pass == 0 {
                results.push(r);
                continue;
            }
            let first = &mut results[k];
            if r.digests != first.digests {
                return Err(format!("section {}: pass {} answered differently from the first", r.name, pass + 1));
            }
            first.ops += r.ops;
            first.block_ops += r.block_ops;
            first.ns += r.ns;
            first.cpu_ns += r.cpu_ns;
        }
    }
    drop(buf);

    if let Some(path) = out {
        let mut b = Vec::new();
        b.extend_from_slice(RESULT_MAGIC);
        b.extend_from_slice(&(results.len() as u32).to_le_bytes());
        for r in &results {
            b.extend_from_slice(&(r.digests.len() as u64).to_le_bytes());
            for d in &r.digests {
                b.extend_from_slice(&d.to_le_bytes());
            }
        }
        std::fs::write(&path, b).map_err(|e| format!("{path}: {e}"))?;
    }

    let mut j = String::from("{\"side\":\"dynamo\",\"crate\":\"dynamo-kv-router 1.6.1 RadixTree\",\"sections\":[");
    for (i, r) in results.iter().enumerate() {
        if i > 0 {
            j.push(',');
        }
        write!(
            j,
            "{{\"name\":{},\"timed\":{},\"ops\":{},\"block_ops\":{},\"ns\":{},\"cpu_ns\":{},\"ns_per_op\":{:.1},\"ns_per_block_op\":{:.1},\"errors\":{},\"rejected_stored_blocks\":{},\"samples\":[",
            json_string(&r.name),
            r.timed,
            r.ops,
            r.block_ops,
            r.ns,
            r.cpu_ns,
            r.ns as f64 / r.ops.max(1) as f64,
            r.ns as f64 / r.block_ops.max(1) as f64,
            r.errors,
            r.rejected_stored_blocks
        )
        .unwrap();
        for (k, s) in r.samples.iter().enumerate() {
            if k > 0 {
                j.push(',');
            }
            j.push('[');
            for (m, (w, v)) in s.iter().enumerate() {
                if m > 0 {
                    j.push(',');
                }
                write!(j, "[{w},{v}]").unwrap();
            }
            j.push(']');
        }
        j.push_str("]}");
    }
    j.push_str("]}");
    println!("{j}");
    // The tree is large; the process exits without tearing it down.
    std::mem::forget(tree);
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dynamo-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
