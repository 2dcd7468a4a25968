//! What the pool reads and answers: index keys, refusals, requests, and the planted bugs.
//!
//! Kept apart from `pool.rs` so that the pool there is only its state and operations.

use crate::json::Json;

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub hash: Vec<u8>,
    pub group: u32,
}

impl Key {
    /// The index key as vLLM spells it: the hash, then the group id in four big-endian bytes.
    pub fn concrete_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let group = self.group.to_be_bytes();
        let digits = |b: &u8| [DIGITS[(b >> 4) as usize] as char, DIGITS[(b & 15) as usize] as char];
        self.hash.iter().chain(&group).flat_map(digits).collect()
    }
}

/// A hash as vLLM's events publish it by default: the low 64 bits of its big-endian value.
pub fn published(hash: &[u8]) -> Json {
    Json::Int(hash[hash.len().saturating_sub(8)..].iter().fold(0u64, |v, &b| (v << 8) | b as u64) as i128)
}

#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    NotEnoughFreeBlocks,
    InvalidArgument,
    UnknownBlock,
    NullBlock,
    NotInUse,
    HashConflict,
    CachingDisabled,
}

impl Refusal {
    /// The error class name the trace format uses, and what was wrong (the answer's `message`).
    pub fn name_and_message(&self) -> (&'static str, &'static str) {
        match self {
            Refusal::NotEnoughFreeBlocks => ("NotEnoughFreeBlocksError", "fewer free blocks than asked for"),
            Refusal::InvalidArgument => (
                "InvalidArgumentError",
                "an argument out of its range (a count, size, group, mask, hash or prefix)",
            ),
            Refusal::UnknownBlock => ("UnknownBlockError", "a block id not in [0, num_blocks)"),
            Refusal::NullBlock => ("NullBlockError", "the null block where it cannot be"),
            Refusal::NotInUse => ("BlockNotInUseError", "a block released more often than it is held"),
            Refusal::HashConflict => (
                "BlockHashConflictError",
                "a block already cached at that prefix, or one with hashes as the target",
            ),
            Refusal::CachingDisabled => {
                ("CachingDisabledError", "a cache entry in a pool without prefix caching")
            }
        }
    }
}

pub type Outcome<T> = Result<T, Refusal>;

pub struct Lora {
    pub name: String,
    pub id: i128,
}

pub struct Item {
    pub identifier: String,
    pub offset: i128,
    pub length: i128,
}

/// What the pool reads of a request.
pub struct Request {
    pub tokens: Vec<i128>,
    pub hashes: Vec<Vec<u8>>,
    pub lora: Option<Lora>,
    pub mm: Vec<Item>,
    pub cache_salt: Option<String>,
    pub session_id: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bugs {
    /// Idle cached blocks go to the head of the free queue (reused first), not the tail.
    pub cached_to_head: bool,
    /// A block listed several times in one `free_blocks` drops one reference, not one per listing.
    pub dup_listing_once: bool,
    /// `cache_full_blocks` ignores `block_mask`: masked-out blocks are indexed too.
    pub mask_ignored: bool,
    /// Multimodal extra keys carry the item's offset in the prompt, not from the chunk's start.
    pub mm_absolute_offset: bool,
    /// Promoting a partial entry to a full block keeps the partial entry (no removal, no event).
    pub promote_keeps_partial: bool,
    /// `cache_full_blocks` caches the null block too, where vLLM skips it (sliding windows).
    pub null_hashed: bool,
    /// The index ignores the KV-cache group: a hash cached in one group hits in every group.
    pub group_blind: bool,
    /// `reset_prefix_cache` forgets the reuse watchers without notifying them.
    pub reset_forgets_watchers: bool,
}

impl Bugs {
    pub const NAMES: [&'static str; 8] = [
        "cached-to-head", "dup-listing-once", "mask-ignored", "mm-absolute-offset",
        "promote-keeps-partial", "group-blind", "reset-forgets-watchers", "null-hashed",
    ];

    pub fn plant(&mut self, name: &str) -> bool {
        let flag = match name {
            "cached-to-head" => &mut self.cached_to_head,
            "dup-listing-once" => &mut self.dup_listing_once,
            "mask-ignored" => &mut self.mask_ignored,
            "mm-absolute-offset" => &mut self.mm_absolute_offset,
            "promote-keeps-partial" => &mut self.promote_keeps_partial,
            "group-blind" => &mut self.group_blind,
            "reset-forgets-watchers" => &mut self.reset_forgets_watchers,
            "null-hashed" => &mut self.null_hashed,
            _ => return false,
        };
        *flag = true;
        true
    }

}

#[cfg(test)]
mod tests {
    use super::Bugs;

    #[test]
    fn every_bug_named_in_the_usage_can_be_planted() {
        for name in Bugs::NAMES {
            assert!(Bugs::default().plant(name), "{}", name);
        }
        assert!(!Bugs::default().plant("no-such-bug"));
    }
}
