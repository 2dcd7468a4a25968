//! A KV-cache block pool with vLLM 0.31's `BlockPool` behaviour, as kvpool's model states it.
//!
//! Blocks are ids `0 .. num_blocks`; block 0 is the null block. The free queue is a
//! doubly linked list over block ids (O(1) removal for `touch`); the prefix-cache index is a
//! multimap from `(hash, group)` to blocks in insertion order. Every operation checks all
//! of its arguments before it changes anything, so a refused call changes nothing.
//!
//! `Bugs` plants a classic mistake or several (`--bug NAME`), for showing that
//! `kvpool conform --exec` finds each.

use std::collections::HashMap;

use crate::free_queue::FreeQueue;
use crate::json::{self, obj, Json};
pub use crate::types::{published, Bugs, Item, Key, Lora, Outcome, Refusal, Request};

pub const NULL: usize = 0;

pub struct Pool {
    pub num_blocks: usize,
    pub caching: bool,
    pub hbs: i128,
    pub events_on: bool,
    pub medium: String,
    /// vLLM 0.31: `touch`/`free_blocks` move the null block's counter (0.33 leaves it alone).
    pub null_counted: bool,
    /// vLLM 0.32 on: a partial entry may end at a block boundary.
    pub boundary_partials: bool,
    pub bugs: Bugs,
    ref_cnt: Vec<i128>,
    free: FreeQueue,
    primary: Vec<Option<(Key, i128)>>,
    secondary: Vec<Vec<Key>>,
    index: HashMap<Key, Vec<usize>>,
    /// Reuse watchers by block, in registration order (a re-registration keeps its place).
    watchers: Vec<(usize, String)>,
    /// Events emitted and not yet taken, as JSON.
    pub events: Vec<Json>,
    /// Watchers notified by the current call: (name, block).
    pub fired: Vec<(String, usize)>,
    /// What the current call told a metrics collector: ("allocated" | "accessed" | "evicted" | "reset", block).
    pub told: Vec<(&'static str, Option<usize>)>,
}

/// Err(`refusal`) where `cond` holds: a call's argument checks, each one line.
pub fn refuse_if<E>(cond: bool, refusal: E) -> Result<(), E> {
    if cond { Err(refusal) } else { Ok(()) }
}

fn count(value: i128) -> Outcome<usize> {
    (value >= 0).then_some(value as usize).ok_or(Refusal::InvalidArgument)
}

fn check_group(group: i128) -> Outcome<u32> {
    u32::try_from(group).map_err(|_| Refusal::InvalidArgument)
}

impl Pool {
    pub fn new(num_blocks: usize, caching: bool, hbs: i128, events_on: bool, medium: String,
               null_counted: bool, boundary_partials: bool, bugs: Bugs) -> Pool {
        Pool {
            num_blocks, caching, hbs, events_on, medium, null_counted, boundary_partials, bugs,
            ref_cnt: vec![0; num_blocks],
            free: FreeQueue::new(num_blocks),
            primary: vec![None; num_blocks],
            secondary: vec![Vec::new(); num_blocks],
            index: HashMap::new(),
            watchers: Vec::new(),
            events: Vec::new(),
            fired: Vec::new(),
            told: Vec::new(),
        }
    }

    fn key(&self, hash: &[u8], group: u32) -> Key {
        Key { hash: hash.to_vec(), group: if self.bugs.group_blind { 0 } else { group } }
    }

    // ------------------------------------------------------------ checks

    fn ids(&self, ids: &[i128]) -> Outcome<Vec<usize>> {
        ids.iter().map(|&b| self.id(b)).collect()
    }

    fn id(&self, b: i128) -> Outcome<usize> {
        usize::try_from(b).ok().filter(|&b| b < self.num_blocks).ok_or(Refusal::UnknownBlock)
    }

    /// Every non-null block holds at least as many references as it is listed.
    fn check_releasable(&self, ids: &[usize]) -> Outcome<()> {
        let mut listed: HashMap<usize, i128> = HashMap::new();
        for &b in ids.iter().filter(|&&b| b != NULL) {
            let n = listed.entry(b).or_insert(0);
            *n += 1;
            refuse_if(*n > self.ref_cnt[b], Refusal::NotInUse)?;
        }
        Ok(())
    }

    fn check_block_size(&self, block_size: i128) -> Outcome<i128> {
        (block_size > 0 && block_size % self.hbs == 0).then_some(block_size).ok_or(Refusal::InvalidArgument)
    }

    // ------------------------------------------------------------ entries

    fn drop_hashes(&mut self, b: usize, emit: bool) {
        let mut keys: Vec<Key> = self.primary[b].take().map(|(k, _)| k).into_iter().collect();
        keys.append(&mut self.secondary[b]);
        for key in keys {
            if let Some(blocks) = self.index.get_mut(&key) {
                blocks.retain(|&x| x != b);
                if blocks.is_empty() {
                    self.index.remove(&key);
                }
            }
            if emit && self.events_on {
                self.events.push(obj(vec![
                    ("type", Json::Str("BlockRemoved".into())),
                    ("block_hashes", Json::Arr(vec![published(&key.hash)])),
                    ("medium", Json::Str(self.medium.clone())),
                    ("group_idx", Json::Int(key.group as i128)),
                    ("locality", Json::Null),
                    ("ownership", Json::Null),
                ]));
            }
        }
    }

    fn indexed(&self, key: &Key, b: usize) -> bool {
        matches!(&self.primary[b], Some((k, _)) if k == key)
            || self.index.get(key).is_some_and(|blocks| blocks.contains(&b))
    }

    fn add_key(&mut self, key: Key, b: usize, num_tokens: i128) {
        if self.indexed(&key, b) {
            return;
        }
        if self.primary[b].is_none() {
            self.primary[b] = Some((key.clone(), num_tokens));
        } else {
            self.secondary[b].push(key.clone());
        }
        self.index.entry(key).or_default().push(b);
    }

    // ------------------------------------------------------------ events

    fn extra_keys(&self, req: &Request, start: i128, end: i128) -> Json {
        let lora = req.lora.iter().map(|l| Json::Str(l.name.clone()));
        let overlaps = |item: &&Item| item.offset < end && start < item.offset + item.length;
        let mm = req.mm.iter().filter(overlaps).map(|item| {
            let offset = if self.bugs.mm_absolute_offset { item.offset } else { item.offset - start };
            Json::Arr(vec![Json::Str(item.identifier.clone()), Json::Int(offset)])
        });
        let salt = req.cache_salt.iter().filter(|s| start == 0 && !s.is_empty());
        let keys: Vec<Json> = lora.chain(mm).chain(salt.map(|s| Json::Str(s.clone()))).collect();
        if keys.is_empty() { Json::Null } else { Json::Arr(keys) }
    }

    /// A `BlockStored` event of `blocks`: each one's hash and its chunk's first and end token.
    #[allow(clippy::too_many_arguments)]
    fn stored(&mut self, req: &Request, blocks: &[(&Vec<u8>, i128, i128)], parent: Option<&Vec<u8>>,
              start: i128, end: i128, block_size: i128, group: u32) {
        let clamp = |i: i128| (i.max(0) as usize).min(req.tokens.len());
        let tokens = &req.tokens[clamp(start)..clamp(end).max(clamp(start))];
        let extra: Vec<Json> = blocks.iter().map(|&(_, a, b)| self.extra_keys(req, a, b)).collect();
        self.events.push(obj(vec![
            ("type", Json::Str("BlockStored".into())),
            ("block_hashes", Json::Arr(blocks.iter().map(|(h, _, _)| published(h)).collect())),
            ("parent_block_hash", parent.map_or(Json::Null, |h| published(h))),
            ("token_ids", Json::Arr(tokens.iter().map(|&t| Json::Int(t)).collect())),
            ("block_size", Json::Int(block_size)),
            ("lora_id", req.lora.as_ref().map_or(Json::Null, |l| Json::Int(l.id))),
            ("medium", Json::Str(self.medium.clone())),
            ("lora_name", req.lora.as_ref().map_or(Json::Null, |l| Json::Str(l.name.clone()))),
            ("extra_keys", if extra.is_empty() { Json::Null } else { Json::Arr(extra) }),
            ("group_idx", Json::Int(group as i128)),
            ("kv_cache_spec_kind", Json::Null),
            ("kv_cache_spec_sliding_window", Json::Null),
            ("locality", Json::Null),
            ("ownership", Json::Null),
            ("session_id", req.session_id.as_ref().map_or(Json::Null, |s| Json::Str(s.clone()))),
        ]));
    }

    /// The request's hash of each whole block of `block_size` tokens.
    fn hashes_at<'r>(&self, req: &'r Request, block_size: i128) -> Vec<&'r Vec<u8>> {
        let per_block = (block_size / self.hbs) as usize;
        (0..req.hashes.len() / per_block).map(|i| &req.hashes[(i + 1) * per_block - 1]).collect()
    }

    // ------------------------------------------------------------ operations

    pub fn get_new_blocks(&mut self, num_blocks: i128) -> Outcome<Vec<usize>> {
        let n = count(num_blocks)?;
        refuse_if(n > self.free.len, Refusal::NotEnoughFreeBlocks)?;
        let taken: Vec<usize> = (0..n).map(|_| self.free.pop_front()).collect();
        for &b in &taken {
            if let Some(at) = self.watchers.iter().position(|(w, _)| *w == b) {
                let (_, name) = self.watchers.remove(at);
                self.fired.push((name, b));
            }
            if self.caching {
                self.drop_hashes(b, true);
                self.told.push(("evicted", Some(b)));
            }
            self.told.push(("allocated", Some(b)));
            self.ref_cnt[b] = 1;
        }
        Ok(taken)
    }

    pub fn free_blocks(&mut self, ids: &[i128]) -> Outcome<()> {
        let mut ids = self.ids(ids)?;
        self.check_releasable(&ids)?;
        if self.bugs.dup_listing_once {
            let mut seen = std::collections::HashSet::new();
            ids.retain(|&b| seen.insert(b));
        }
        ids.retain(|&b| b != NULL || self.null_counted);
        let (mut first, mut last) = (Vec::new(), Vec::new());
        for &b in &ids {
            self.ref_cnt[b] -= 1;
            if self.ref_cnt[b] == 0 && b != NULL {
                if self.caching && self.primary[b].is_some() && !self.bugs.cached_to_head {
                    last.push(b);
                } else {
                    first.push(b);
                }
            }
        }
        self.free.requeue(&first, &last);
        Ok(())
    }

    pub fn touch(&mut self, ids: &[i128]) -> Outcome<()> {
        let mut ids = self.ids(ids)?;
        ids.retain(|&b| b != NULL || self.null_counted);
        for b in ids {
            if self.ref_cnt[b] == 0 && self.free.queued[b] {
                self.free.remove(b);
            }
            self.ref_cnt[b] += 1;
            self.told.push(("accessed", Some(b)));
        }
        Ok(())
    }

    pub fn unpin_blocks(&mut self, ids: &[i128], watcher: &str) -> Outcome<()> {
        let ids = self.ids(ids)?;
        refuse_if(ids.contains(&NULL), Refusal::NullBlock)?;
        self.check_releasable(&ids)?;
        for b in ids {
            self.ref_cnt[b] -= 1;
            match self.watchers.iter_mut().find(|(w, _)| *w == b) {
                Some(entry) => entry.1 = watcher.to_string(),
                None => self.watchers.push((b, watcher.to_string())),
            }
            if self.ref_cnt[b] == 0 {
                self.free.push_back(b);
            }
        }
        Ok(())
    }

    pub fn evict_blocks(&mut self, ids: &[i128]) -> Outcome<()> {
        for b in self.ids(ids)? {
            self.told.push(("evicted", Some(b)));
            self.drop_hashes(b, true);
        }
        Ok(())
    }

    pub fn maybe_evict_cached_block(&mut self, b: i128) -> Outcome<bool> {
        let b = self.id(b)?;
        let had = self.primary[b].is_some();
        self.told.push(("evicted", Some(b)));
        self.drop_hashes(b, true);
        Ok(had)
    }

    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_blocks - self.free.len != 1 {
            return false;
        }
        let watchers = std::mem::take(&mut self.watchers);
        if !self.bugs.reset_forgets_watchers {
            self.fired.extend(watchers.into_iter().map(|(b, name)| (name, b)));
        }
        self.index.clear();
        self.primary.iter_mut().for_each(|p| *p = None);
        self.secondary.iter_mut().for_each(|s| s.clear());
        if self.events_on {
            self.events.push(obj(vec![("type", Json::Str("AllBlocksCleared".into()))]));
        }
        self.told.push(("reset", None));
        true
    }

    #[allow(clippy::too_many_arguments)]
    pub fn cache_full_blocks(&mut self, req: &Request, ids: &[i128], num_cached: i128, num_full: i128,
                             block_size: i128, group: i128, mask: Option<&[bool]>) -> Outcome<()> {
        let num_cached = count(num_cached)?;
        let num_full = count(num_full)?;
        let bs = self.check_block_size(block_size)?;
        let group = check_group(group)?;
        if num_cached >= num_full {
            return Ok(());
        }
        refuse_if(!self.caching, Refusal::CachingDisabled)?;
        refuse_if(num_full > ids.len(), Refusal::InvalidArgument)?;
        let new_ids = self.ids(&ids[num_cached..num_full])?;
        refuse_if(mask.is_some_and(|m| m.len() != new_ids.len()), Refusal::InvalidArgument)?;
        let hashes = self.hashes_at(req, bs);
        let chosen: Vec<(usize, usize)> = new_ids.iter().enumerate()
            .filter(|&(i, &b)| (b != NULL || self.bugs.null_hashed)
                && (self.bugs.mask_ignored || mask.is_none_or(|m| m[i])))
            .map(|(i, &b)| (num_cached + i, b))
            .collect();
        let parent_needed = if self.events_on { num_cached } else { 0 };
        let needed = chosen.iter().map(|&(i, _)| i + 1).max().unwrap_or(0).max(parent_needed);
        refuse_if(hashes.len() < needed, Refusal::InvalidArgument)?;
        // A chosen block may only be hashed at a shorter prefix (a partial entry promoted).
        let mut covered: HashMap<usize, i128> = new_ids.iter()
            .filter_map(|&b| self.primary[b].as_ref().map(|(_, n)| (b, *n)))
            .collect();
        for &(i, b) in &chosen {
            let tokens = (i as i128 + 1) * bs;
            refuse_if(covered.get(&b).is_some_and(|&n| n >= tokens), Refusal::HashConflict)?;
            covered.insert(b, tokens);
        }
        for &(i, b) in &chosen {
            if self.primary[b].is_some() && !self.bugs.promote_keeps_partial {
                self.drop_hashes(b, true);
            }
            let key = self.key(hashes[i], group);
            self.add_key(key, b, (i as i128 + 1) * bs);
        }
        if self.events_on {
            let parent = if num_cached > 0 { Some(hashes[num_cached - 1]) } else { None };
            let blocks: Vec<_> = chosen.iter()
                .map(|&(i, _)| (hashes[i], i as i128 * bs, (i as i128 + 1) * bs)).collect();
            self.stored(req, &blocks, parent, num_cached as i128 * bs, num_full as i128 * bs, bs, group);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn cache_partial_block(&mut self, req: &Request, b: i128, num_tokens: i128, group: i128,
                               block_size: i128, replace: bool) -> Outcome<Option<Key>> {
        let b = self.id(b)?;
        if b == NULL {
            return Ok(None);
        }
        let hbs = self.hbs;
        let bs = self.check_block_size(block_size)?;
        let group = check_group(group)?;
        refuse_if(num_tokens <= 0 || num_tokens % hbs != 0, Refusal::InvalidArgument)?;
        let partial = replace || self.boundary_partials || (bs > hbs && num_tokens % bs != 0);
        refuse_if(!partial, Refusal::InvalidArgument)?;
        let chunks = (num_tokens / hbs) as usize;
        refuse_if(chunks > req.hashes.len(), Refusal::InvalidArgument)?;
        refuse_if(!self.caching, Refusal::CachingDisabled)?;
        let key = self.key(&req.hashes[chunks - 1], group);
        let already = !replace && self.indexed(&key, b);
        if replace || (!already && self.primary[b].as_ref().is_some_and(|(_, n)| *n < num_tokens)) {
            self.drop_hashes(b, true);
        }
        self.add_key(key.clone(), b, num_tokens);
        if self.events_on && !already {
            let start = (chunks as i128 - 1) * hbs;
            let parent = if chunks > 1 { Some(&req.hashes[chunks - 2]) } else { None };
            self.stored(req, &[(&req.hashes[chunks - 1], start, num_tokens)], parent, start, num_tokens,
                        num_tokens - start, group);
        }
        Ok(Some(key))
    }

    pub fn move_block_hashes(&mut self, src: i128, dst: i128) -> Outcome<()> {
        let (src, dst) = (self.id(src)?, self.id(dst)?);
        refuse_if(self.primary[dst].is_some() || !self.secondary[dst].is_empty(), Refusal::HashConflict)?;
        refuse_if(dst == NULL && self.primary[src].is_some(), Refusal::NullBlock)?;
        let Some((key, num_tokens)) = self.primary[src].clone() else {
            return Ok(());
        };
        let keys: Vec<Key> = std::iter::once(key).chain(self.secondary[src].iter().cloned()).collect();
        self.drop_hashes(src, false);
        for key in keys {
            self.add_key(key, dst, num_tokens);
        }
        Ok(())
    }

    pub fn insert_block_hash(&mut self, req: &Request, prefix_tokens: i128, group: i128, b: i128,
                             num_tokens: Option<i128>) -> Outcome<()> {
        let b = self.id(b)?;
        let hbs = self.hbs;
        let bad_prefix = prefix_tokens <= 0 || prefix_tokens % hbs != 0;
        refuse_if(bad_prefix || (prefix_tokens / hbs) as usize > req.hashes.len(), Refusal::InvalidArgument)?;
        let group = check_group(group)?;
        refuse_if(b == NULL, Refusal::NullBlock)?;
        refuse_if(!self.caching, Refusal::CachingDisabled)?;
        let sized = num_tokens.is_some_and(|n| n > 0 && n % hbs == 0);
        refuse_if(self.primary[b].is_none() && !sized, Refusal::InvalidArgument)?;
        let key = self.key(&req.hashes[(prefix_tokens / hbs) as usize - 1], group);
        self.add_key(key, b, num_tokens.unwrap_or(0));
        Ok(())
    }

    pub fn emit_cached_block_events(&mut self, req: &Request, num_cached: i128, block_size: i128,
                                    group: i128) -> Outcome<()> {
        let num_cached = count(num_cached)?;
        let bs = self.check_block_size(block_size)?;
        let group = check_group(group)?;
        if !self.events_on || num_cached == 0 {
            return Ok(());
        }
        let hashes = self.hashes_at(req, bs);
        refuse_if(num_cached > hashes.len(), Refusal::InvalidArgument)?;
        let blocks: Vec<_> = (0..num_cached)
            .map(|i| (hashes[i], i as i128 * bs, (i as i128 + 1) * bs)).collect();
        self.stored(req, &blocks, None, 0, num_cached as i128 * bs, bs, group);
        Ok(())
    }

    pub fn take_events(&mut self) -> Vec<Json> {
        std::mem::take(&mut self.events)
    }

    pub fn get_cached_block(&self, hash: &[u8], groups: &[i128]) -> Outcome<Option<Vec<usize>>> {
        let groups: Vec<u32> = groups.iter().map(|&g| check_group(g)).collect::<Outcome<_>>()?;
        let first = |g| self.index.get(&self.key(hash, g)).and_then(|blocks| blocks.first().copied());
        Ok(groups.into_iter().map(first).collect())
    }

    pub fn is_block_writable(&self, b: i128) -> Outcome<bool> {
        let b = self.id(b)?;
        Ok(b != NULL && self.ref_cnt[b] == 1 && self.primary[b].is_none())
    }

    pub fn get_num_free_blocks(&self) -> usize {
        self.free.len
    }

    pub fn get_usage(&self) -> f64 {
        let real = self.num_blocks - 1;
        if real == 0 { 0.0 } else { 1.0 - self.free.len as f64 / real as f64 }
    }

    /// Block `b`'s primary key and its token count, as an observation shows it.
    fn primary_shown(&self, b: usize) -> Json {
        match &self.primary[b] {
            None => Json::Null,
            Some((k, n)) => Json::Arr(vec![Json::Str(k.concrete_hex()), Json::Int(*n)]),
        }
    }

    /// Block `b`'s secondary keys, sorted, as the model shows them.
    fn secondary_shown(&self, b: usize) -> Json {
        let mut keys: Vec<&Key> = self.secondary[b].iter().collect();
        keys.sort();
        Json::Arr(keys.into_iter().map(|k| Json::Str(k.concrete_hex())).collect())
    }

    /// What the whole pool's observation says of `blocks` and `keys` (`shown` of an observe answer).
    pub fn shown(&self, blocks: &[usize], keys: &[(Vec<u8>, i128)]) -> Json {
        let index = keys.iter().map(|(hash, group)| {
            let found = u32::try_from(*group).ok().and_then(|g| self.index.get(&self.key(hash, g)));
            json::ids(found.into_iter().flatten().copied())
        }).collect();
        obj(vec![
            ("ref", Json::Arr(blocks.iter().map(|&b| Json::Int(self.ref_cnt[b])).collect())),
            ("primary", Json::Arr(blocks.iter().map(|&b| self.primary_shown(b)).collect())),
            ("secondary", Json::Arr(blocks.iter().map(|&b| self.secondary_shown(b)).collect())),
            ("watched", Json::Arr(blocks.iter()
                .map(|b| Json::Bool(self.watchers.iter().any(|(w, _)| w == b))).collect())),
            ("index", Json::Arr(index)),
        ])
    }

    /// The whole pool, as a trace's `observation`.
    pub fn observation(&self) -> Json {
        let mut index: Vec<(&Key, &Vec<usize>)> = self.index.iter().collect();
        index.sort();
        obj(vec![
            ("ref", Json::Arr(self.ref_cnt.iter().map(|&r| Json::Int(r)).collect())),
            ("free", json::ids(self.free.ids())),
            ("primary", Json::Arr((0..self.num_blocks).map(|b| self.primary_shown(b)).collect())),
            ("secondary", Json::Arr((0..self.num_blocks).map(|b| self.secondary_shown(b)).collect())),
            ("index", Json::Arr(index.into_iter().map(|(k, blocks)| {
                Json::Arr(vec![Json::Str(k.concrete_hex()), json::ids(blocks.iter().copied())])
            }).collect())),
            ("watched", json::ids(self.watchers.iter().map(|(b, _)| *b))),
            ("num_free", Json::Int(self.free.len as i128)),
        ])
    }
}
