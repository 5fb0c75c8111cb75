//! The plain reading of a chunk against the general one.

use super::*;

/// A translator past `message_start`.
fn started() -> ChatStreamToMessages {
    let mut translator = ChatStreamToMessages::new("m");
    translator.push(br#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"role":"assistant"}}]}"#, &mut Vec::new());
    translator
}

/// What the general reading (a tree) writes for `chunk`.
fn general(translator: &mut ChatStreamToMessages, chunk: &[u8], out: &mut Vec<u8>) {
    let result = match serde_json::from_slice::<Value>(chunk) {
        Ok(value) => translator.chunk(&value, out),
        Err(_) => Err("the backend sent a chunk that is not JSON"),
    };
    if let Err(why) = result {
        translator.fail(why, out);
    }
}

/// Every chunk, whichever reading takes it, writes what the general
/// reading writes, and leaves the translator as it would (the next
/// chunk writes the same too).
#[test]
fn the_plain_reading_writes_what_the_general_one_does() {
    let chunks = [
        r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":null,"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"a\"b\\n\u00e9 \ud83d\ude00"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"reasoning_content":"think"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"reasoning":"think","content":"say"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"reasoning_content":"","reasoning":"r"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":""}}]}"#,
        r#"{"choices":[{"index":0,"delta":null}]}"#,
        r#"{"choices":[{"index":0}]}"#,
        r#"{"choices":[{"index":1,"delta":{"content":"other"}}]}"#,
        r#"{"choices":[{"index":1,"delta":{"content":7}},{"delta":{"content":"first"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":["x"]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"a","content":"b"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"a"}}],"choices":[]}"#,
        r#"{"error":null,"choices":[{"index":0,"delta":{"content":"a"}}]}"#,
        r#"{"usage":null,"choices":[{"index":0,"delta":{"content":"a"}}]}"#,
        r#"{"usage":{"prompt_tokens":1,"completion_tokens":2},"choices":[{"index":0,"delta":{"content":"a"}}]}"#,
        r#"{"choices":null}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"a","tool_calls":null}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t","function":{"name":"f","arguments":"{}"}}]}}]}"#,
        r#"{"choices":[{"index":"0","delta":{"content":"a"}}]}"#,
        r#"{"choices":[5]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"error"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"end"},"finish_reason":"stop"}]}"#,
        r#"{"choices":[{"index":0,"delta":"text"}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"a"}}]"#,
    ];
    let next = br#"{"choices":[{"index":0,"delta":{"content":"next"}}]}"#;
    // The chunks a stream is made of take the plain reading.
    for plain in &chunks[..9] {
        assert!(started().plain_chunk(plain.as_bytes(), &mut Vec::new()), "{plain}");
    }
    for chunk in chunks {
        let (mut plain, mut tree) = (started(), started());
        let (mut plain_out, mut tree_out) = (Vec::new(), Vec::new());
        plain.push(chunk.as_bytes(), &mut plain_out);
        general(&mut tree, chunk.as_bytes(), &mut tree_out);
        plain.push(next, &mut plain_out);
        general(&mut tree, next, &mut tree_out);
        assert_eq!(String::from_utf8_lossy(&plain_out), String::from_utf8_lossy(&tree_out), "{chunk}");
    }
}
