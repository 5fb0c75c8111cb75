//! waycast's test doubles and the test material that talks to them: the
//! mock OpenAI-compatible inference upstream (`upstream`, also the
//! `waycast-mock-upstream` binary the e2e node runs as a pod), an upstream
//! that misbehaves on purpose (`hostile`), one that tries to make a pooled
//! connection carry one answer to another request (`desync`), the benchmark sink with canned
//! answers (`sink`), a vLLM-like mode of the mock (`vllm`: slots, a queue, a
//! prefix cache, vLLM's metrics), the keys and config every gateway
//! test starts from (`fixtures`), throwaway certificates (`pki`) and a
//! token issuer of its own (`tokens`: signed JWTs and their key set). The
//! answers' shapes per API are in `openai`.
//!
//! Mocks only the inference upstream: everything else in the tests is real.

mod beside_chat;
pub mod collector;
pub mod desync;
pub mod fixtures;
pub mod forged_usage;
pub mod hostile;
mod openai;
pub mod pki;
pub mod sink;
pub mod tokens;
mod tools;
pub mod upstream;
pub mod vllm;
