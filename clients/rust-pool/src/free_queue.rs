//! The free queue: O(1) removal from the middle (`touch`), head-first allocation.

/// The free queue: a doubly linked list over block ids, head first, with a sentinel.
pub struct FreeQueue {
    next: Vec<usize>,
    prev: Vec<usize>,
    pub queued: Vec<bool>,
    pub len: usize,
    sentinel: usize,
}

impl FreeQueue {
    pub fn new(num_blocks: usize) -> FreeQueue {
        let sentinel = num_blocks;
        let mut q = FreeQueue {
            next: vec![sentinel; num_blocks + 1],
            prev: vec![sentinel; num_blocks + 1],
            queued: vec![false; num_blocks],
            len: 0,
            sentinel,
        };
        for b in 1..num_blocks {
            q.push_back(b);
        }
        q
    }

    pub fn link_after(&mut self, at: usize, b: usize) {
        let after = self.next[at];
        self.next[at] = b;
        self.prev[b] = at;
        self.next[b] = after;
        self.prev[after] = b;
        self.queued[b] = true;
        self.len += 1;
    }

    pub fn push_back(&mut self, b: usize) {
        let last = self.prev[self.sentinel];
        self.link_after(last, b);
    }

    pub fn remove(&mut self, b: usize) {
        let (p, n) = (self.prev[b], self.next[b]);
        self.next[p] = n;
        self.prev[n] = p;
        self.queued[b] = false;
        self.len -= 1;
    }

    pub fn pop_front(&mut self) -> usize {
        let b = self.next[self.sentinel];
        self.remove(b);
        b
    }

    /// `first` at the head, in order; `last` at the tail, in order.
    pub fn requeue(&mut self, first: &[usize], last: &[usize]) {
        let mut at = self.sentinel;
        for &b in first {
            self.link_after(at, b);
            at = b;
        }
        for &b in last {
            self.push_back(b);
        }
    }

    pub fn ids(&self) -> Vec<usize> {
        let after = |&b: &usize| Some(self.next[b]).filter(|&n| n != self.sentinel);
        let mut out = Vec::with_capacity(self.len);
        out.extend(std::iter::successors(after(&self.sentinel), after));
        out
    }
}
