//! The mock's vLLM-like mode: what makes picking an endpoint matter, without
//! a GPU. A server has a fixed number of slots (a batch); requests beyond
//! them wait in a queue; a request's first token comes after its prefill
//! (time per prompt byte, a tenth of it when the prompt's prefix is in the
//! prefix cache, an LRU of prefix hashes), then one token per `token_time`
//! while it holds its slot. `/metrics` exposes vLLM's own metric names.
//!
//! ```text
//! request ─► queue (vllm:num_requests_waiting) ─► slot (vllm:num_requests_running)
//!   ─► prefill (cache hit: ÷10) ─► first token ─► a token every token_time ─► slot freed
//! ```

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};

/// How the simulated server behaves.
#[derive(Debug, Clone)]
pub struct VllmOptions {
    /// Requests served at once; more wait.
    pub slots: usize,
    /// Prefill time per prompt byte.
    pub prefill_per_byte: Duration,
    /// Time between two output tokens.
    pub token_time: Duration,
    /// Prompt bytes (from the start of `messages`/`prompt`) that identify a
    /// prefix.
    pub prefix_bytes: usize,
    /// Prefixes the cache holds.
    pub cache_entries: usize,
}

impl Default for VllmOptions {
    fn default() -> Self {
        Self {
            slots: 4,
            prefill_per_byte: Duration::from_micros(100),
            token_time: Duration::from_millis(10),
            prefix_bytes: 256,
            cache_entries: 64,
        }
    }
}

/// One simulated inference server.
#[derive(Debug)]
pub struct Engine {
    /// Its behaviour.
    pub options: VllmOptions,
    slots: Arc<Semaphore>,
    waiting: AtomicI64,
    running: Arc<AtomicI64>,
    cache: Mutex<VecDeque<u64>>,
    hits: AtomicU64,
    queries: AtomicU64,
    served: AtomicU64,
}

/// A request holding a slot: freed when dropped (the response ended).
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    running: Arc<AtomicI64>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Engine {
    /// A server with `options`.
    pub fn new(options: VllmOptions) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(options.slots.max(1))),
            options,
            waiting: AtomicI64::new(0),
            running: Arc::new(AtomicI64::new(0)),
            cache: Mutex::new(VecDeque::new()),
            hits: AtomicU64::new(0),
            queries: AtomicU64::new(0),
            served: AtomicU64::new(0),
        }
    }

    /// Waits in the queue for a slot.
    pub async fn admit(&self) -> Option<Slot> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let permit = self.slots.clone().acquire_owned().await.ok();
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        let permit = permit?;
        self.running.fetch_add(1, Ordering::Relaxed);
        self.served.fetch_add(1, Ordering::Relaxed);
        Some(Slot { _permit: permit, running: self.running.clone() })
    }

    /// The prefill time of `body`: per prompt byte, a tenth of it when the
    /// prompt's prefix was seen recently (then it moves to the front).
    pub async fn prefill(&self, body: &[u8]) -> Duration {
        let start =
            ["\"messages\"", "\"prompt\"", "\"input\""].iter().find_map(|key| find(body, key.as_bytes())).unwrap_or(0);
        let prefix = &body[start..body.len().min(start + self.options.prefix_bytes)];
        let hash = fnv(prefix);
        self.queries.fetch_add(1, Ordering::Relaxed);
        let hit = {
            let mut cache = self.cache.lock().await;
            let hit = match cache.iter().position(|h| *h == hash) {
                Some(index) => {
                    cache.remove(index);
                    true
                }
                None => false,
            };
            cache.push_front(hash);
            cache.truncate(self.options.cache_entries);
            hit
        };
        let full = self.options.prefill_per_byte.saturating_mul(u32::try_from(body.len()).unwrap_or(u32::MAX));
        if hit {
            self.hits.fetch_add(1, Ordering::Relaxed);
            full / 10
        } else {
            full
        }
    }

    /// Whether any request is queued or running.
    pub fn busy(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0 || self.running.load(Ordering::Relaxed) > 0
    }

    /// `/metrics` in Prometheus text, with vLLM's names.
    pub fn metrics(&self) -> String {
        let running = self.running.load(Ordering::Relaxed);
        #[allow(clippy::cast_precision_loss, reason = "a ratio for display")]
        let usage = running as f64 / self.options.slots.max(1) as f64;
        format!(
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting {}\n\
             # TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {running}\n\
             # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc {usage}\n\
             # TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total {}\n\
             # TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total {}\n\
             # TYPE vllm:request_success_total counter\nvllm:request_success_total {}\n",
            self.waiting.load(Ordering::Relaxed),
            self.hits.load(Ordering::Relaxed),
            self.queries.load(Ordering::Relaxed),
            self.served.load(Ordering::Relaxed),
        )
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_queue_and_the_prefix_cache_cuts_prefill() {
        let engine = Arc::new(Engine::new(VllmOptions { slots: 1, ..VllmOptions::default() }));
        let first = engine.admit().await.unwrap();
        let queued = tokio::spawn({
            let engine = engine.clone();
            async move { engine.admit().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(engine.metrics().contains("vllm:num_requests_waiting 1\n"), "{}", engine.metrics());
        drop(first);
        let second = queued.await.unwrap().unwrap();
        assert!(engine.metrics().contains("vllm:num_requests_running 1\n"));
        drop(second);
        let body = br#"{"model":"m","messages":[{"role":"system","content":"a long shared system prompt"}]}"#;
        let cold = engine.prefill(body).await;
        let warm = engine.prefill(body).await;
        assert_eq!(warm, cold / 10);
        assert!(engine.metrics().contains("vllm:prefix_cache_hits_total 1\n"));
        assert!(engine.metrics().contains("vllm:prefix_cache_queries_total 2\n"));
    }
}
