//! What the gateway reads on the wire, by what it means to it: each
//! dialect names its fields and counts, and says which of these each is.

/// What a top-level request field means to the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The model's name (a string): routing.
    Model,
    /// A stream asked for (a boolean): charging.
    Stream,
    /// OpenAI's `stream_options` (an object or `null`): the gateway asks
    /// for usage through it.
    StreamOptions,
    /// A bound on output tokens (a non-negative integer): the reservation.
    OutputBound,
    /// How many completions are asked for (a non-negative integer): the
    /// reservation multiplies by it.
    Choices,
    /// Where the prompt starts: prefix affinity hashes from there.
    Prompt,
    /// Who the client says its end user is (OpenAI's `user`, a string):
    /// recorded as said, never trusted (`waycast.client_user`).
    ClientUser,
}

/// What a count of a response's `usage` object means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageCount {
    /// Prompt tokens, those read from the server's cache included.
    Prompt,
    /// Completion (output) tokens.
    Completion,
    /// Input tokens: the prompt's, less what a cache count beside it says
    /// was read from or written to the cache.
    Input,
    /// Output tokens.
    Output,
    /// Prompt tokens read from the cache, not in [`UsageCount::Input`].
    CacheRead,
    /// Prompt tokens written to the cache, not in [`UsageCount::Input`].
    CacheCreation,
    /// An object whose `cached_tokens` counts the prompt tokens read from
    /// the cache (included in the prompt count).
    CachedDetails,
}
