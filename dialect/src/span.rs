//! Source spans and the side tables that hold them.
//!
//! Spans are metadata, not meaning: two modules that differ only in where their text was written
//! are equal. So spans live in [`SpanTable`]s, whose equality is always true, beside the IR.

use std::collections::BTreeMap;

/// Byte range `[start, end)` in the model file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        Span {
            start: start as u32,
            end: end as u32,
        }
    }

    /// The smallest span that covers both.
    pub fn merge(self, other: Span) -> Span {
        Span {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }

    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }
}

/// Spans keyed by IR entity. Missing keys read as the empty span at 0.
#[derive(Clone, Debug)]
pub struct SpanTable<K: Ord>(BTreeMap<K, Span>);

impl<K: Ord> Default for SpanTable<K> {
    fn default() -> Self {
        SpanTable(BTreeMap::new())
    }
}

impl<K: Ord> PartialEq for SpanTable<K> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<K: Ord> SpanTable<K> {
    pub fn set(&mut self, key: K, span: Span) {
        self.0.insert(key, span);
    }

    pub fn get(&self, key: &K) -> Span {
        self.0.get(key).copied().unwrap_or_default()
    }

    /// The span of `key`, if one was recorded.
    pub fn lookup(&self, key: &K) -> Option<Span> {
        self.0.get(key).copied()
    }

    /// The spans of the keys `map` has, under their new keys.
    pub fn remapped(&self, map: &std::collections::HashMap<K, K>) -> SpanTable<K>
    where
        K: std::hash::Hash + Eq + Copy,
    {
        SpanTable(
            self.0
                .iter()
                .filter_map(|(k, &s)| map.get(k).map(|&n| (n, s)))
                .collect(),
        )
    }
}
