//! The body scanner on well-formed, hostile and generated inputs.

use waycast_crds::seeded::Xorshift;

use super::*;

/// The tables below read a request in OpenAI's dialect.
fn scan(body: &[u8]) -> Result<RequestFields<'_>, GatewayError> {
    super::scan(body, Dialect::OpenAi)
}

/// The shared seeded generator (so property runs repeat), with the JSON
/// this test draws from it.
struct Random(Xorshift);

impl std::ops::Deref for Random {
    type Target = Xorshift;
    fn deref(&self) -> &Xorshift {
        &self.0
    }
}

impl std::ops::DerefMut for Random {
    fn deref_mut(&mut self) -> &mut Xorshift {
        &mut self.0
    }
}

impl Random {
    /// Whitespace JSON allows between tokens, often none.
    fn space(&mut self) -> &'static str {
        ["", "", "", " ", "\n  ", "\t", "\r\n"][self.index(7)]
    }

    /// A JSON string of any text: escapes of every kind, surrogate pairs,
    /// characters beyond ASCII; never empty when `non_empty`.
    fn string(&mut self, non_empty: bool) -> String {
        let pieces = [
            "a",
            "Z",
            "9",
            " ",
            "-",
            "/",
            ":",
            "é",
            "☃",
            "😀",
            "\\\"",
            "\\\\",
            "\\/",
            "\\b",
            "\\f",
            "\\n",
            "\\r",
            "\\t",
            "\\u00e9",
            "\\u0041",
            "\\ud83d\\ude00",
            "model",
            "{",
            "}",
            "[",
            ",",
        ];
        let count = self.index(12) + usize::from(non_empty);
        let text: String = (0..count).map(|_| self.pick(&pieces)).collect();
        format!("\"{text}\"")
    }

    /// A key as a client may write it: sometimes with a letter escaped.
    fn key(&mut self, name: &str) -> String {
        match self.index(4) {
            0 if !name.is_empty() => {
                let at = self.index(name.len());
                let (head, tail) = name.split_at(at);
                let mut tail = tail.chars();
                let escaped = tail.next().map(|c| format!("\\u{:04x}", c as u32)).unwrap_or_default();
                format!("\"{head}{escaped}{}\"", tail.as_str())
            }
            _ => format!("\"{name}\""),
        }
    }

    fn number(&mut self) -> String {
        self.pick(&["0", "-0", "7", "-12", "3.25", "-0.5e-3", "1E+9", "12345678901234567890", "6.02e23"]).to_owned()
    }

    /// Any JSON value, nested at most `depth`.
    fn any(&mut self, depth: usize) -> String {
        match self.index(if depth == 0 { 4 } else { 6 }) {
            0 => self.string(false),
            1 => self.number(),
            2 => self.pick(&["true", "false"]).to_owned(),
            3 => "null".to_owned(),
            4 => {
                let items: Vec<String> = (0..self.index(4))
                    .map(|_| format!("{}{}{}", self.space(), self.any(depth - 1), self.space()))
                    .collect();
                format!("[{}]", items.join(","))
            }
            _ => {
                let keys = ["model", "stream", "messages", "n", "x", ""];
                let fields: Vec<String> = (0..self.index(4))
                    .map(|_| {
                        let key = self.pick(&keys);
                        let key = self.key(key);
                        format!("{}{key}{}:{}{}", self.space(), self.space(), self.any(depth - 1), self.space())
                    })
                    .collect();
                format!("{{{}}}", fields.join(","))
            }
        }
    }

    /// A request OpenAI would accept: an object with a non-empty string
    /// model, the fields the gateway reads typed as OpenAI types them, any
    /// other fields holding anything, in any order, each key once.
    fn request(&mut self) -> String {
        let integer = |random: &mut Self| -> String {
            match random.index(4) {
                0 => "null".to_owned(),
                _ => (random.next_u64() % 100_000).to_string(),
            }
        };
        let mut fields = vec![("model".to_owned(), self.string(true))];
        type Field = (&'static str, fn(&mut Random) -> String);
        let optional: [Field; 10] = [
            ("stream", |r| r.pick(&["true", "false", "null"]).to_owned()),
            ("stream_options", |r| if r.index(3) == 0 { "null".to_owned() } else { r.object_of_anything() }),
            ("max_tokens", integer),
            ("max_completion_tokens", integer),
            ("max_output_tokens", integer),
            ("n", integer),
            ("best_of", integer),
            ("messages", |r| r.any(4)),
            ("temperature", |r| r.number()),
            ("metadata", |r| r.any(5)),
        ];
        for (name, value) in optional {
            if self.index(2) == 0 {
                fields.push((name.to_owned(), value(self)));
            }
        }
        // Shuffled (Fisher–Yates).
        for i in (1..fields.len()).rev() {
            let j = self.index(i + 1);
            fields.swap(i, j);
        }
        let members: Vec<String> = fields
            .iter()
            .map(|(name, value)| {
                format!("{}{}{}:{}{value}{}", self.space(), self.key(name), self.space(), self.space(), self.space())
            })
            .collect();
        format!("{}{{{}}}{}", self.space(), members.join(","), self.space())
    }

    fn object_of_anything(&mut self) -> String {
        let value = self.any(3);
        format!("{{\"include_usage\":{},\"x\":{value}}}", self.pick(&["true", "false"]))
    }

    /// A JSON value (valid), nested at most `depth`.
    fn value(&mut self, depth: usize) -> String {
        let strings = ["\"model\"", "\"m\\u006f\"", "\"a\\\"b\"", "\"caf\u{e9}\"", "\"\""];
        match self.index(if depth == 0 { 4 } else { 6 }) {
            0 => strings[self.index(strings.len())].to_owned(),
            1 => ["0", "-1.5e3", "12", "0.25"][self.index(4)].to_owned(),
            2 => ["true", "false"][self.index(2)].to_owned(),
            3 => "null".to_owned(),
            4 => {
                let items: Vec<String> = (0..self.index(4)).map(|_| self.value(depth - 1)).collect();
                format!("[{}]", items.join(","))
            }
            _ => {
                let keys = ["\"model\"", "\"stream\"", "\"x\"", "\"messages\""];
                let fields: Vec<String> = (0..self.index(4))
                    .map(|_| format!("{}:{}", keys[self.index(keys.len())], self.value(depth - 1)))
                    .collect();
                format!("{{{}}}", fields.join(","))
            }
        }
    }
}

/// On any input the scanner answers without panicking; on valid JSON it
/// agrees with serde_json about the top-level model (or refuses a
/// duplicate, which serde_json's last-wins reading would hide).
#[test]
fn property_agrees_with_serde_json_and_never_panics() {
    let mut random = Random(Xorshift::new(0x2545_f491_4f6c_dd1d));
    for _ in 0..5_000 {
        let mut document = random.value(4);
        if random.index(2) == 0 {
            document = format!("{{\"model\":\"top\",\"body\":{document}}}");
        }
        let scanned = scan(document.as_bytes());
        let parsed: Result<serde_json::Value, _> = serde_json::from_str(&document);
        match (&scanned, parsed.as_ref().ok().and_then(|v| v.as_object())) {
            (Ok(fields), Some(object)) => {
                assert_eq!(Some(fields.model.as_ref()), object.get("model").and_then(|m| m.as_str()), "{document}")
            }
            (Ok(_), None) => panic!("scanned a body serde_json refuses: {document}"),
            (Err(_), _) => {}
        }
        // Cut anywhere, or with a byte flipped: an answer, never a panic.
        let bytes = document.as_bytes();
        let cut = random.index(bytes.len() + 1);
        let _ = scan(&bytes[..cut]);
        let mut flipped = bytes.to_vec();
        if let Some(byte) = flipped.get_mut(random.index(bytes.len().max(1))) {
            *byte ^= 1 << random.index(8);
        }
        let _ = scan(&flipped);
    }
}

/// A request OpenAI would accept is never refused, and the scanner reads
/// each field as serde_json does.
#[test]
fn property_a_valid_request_is_never_refused() {
    let mut random = Random(Xorshift::new(0x6a09_e667_f3bc_c908));
    for _ in 0..5_000 {
        let body = random.request();
        let fields = scan(body.as_bytes()).unwrap_or_else(|error| panic!("{error}: {body}"));
        let parsed: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(fields.model, parsed["model"].as_str().unwrap(), "{body}");
        let span: String = serde_json::from_str(&body[fields.model_span.clone()]).unwrap();
        assert_eq!(span, fields.model, "the span is the model's string: {body}");
        assert_eq!(fields.stream, parsed["stream"] == true, "{body}");
        let bound = ["max_tokens", "max_completion_tokens", "max_output_tokens"];
        assert_eq!(fields.max_tokens, bound.iter().filter_map(|name| parsed[name].as_u64()).max(), "{body}");
        let asked = ["n", "best_of"].iter().filter_map(|name| parsed[name].as_u64()).max().unwrap_or(1);
        assert_eq!(fields.choices, asked.max(1), "{body}");
    }
}

fn model_of(body: &str) -> Result<String, GatewayError> {
    scan(body.as_bytes()).map(|fields| fields.model.into_owned())
}

#[test]
fn finds_the_top_level_model() {
    let body = r#"{"messages":[{"role":"user","content":"say \"model\": 1","model":"nested"}],"model":"llama3","stream":true}"#;
    let fields = scan(body.as_bytes()).unwrap();
    assert_eq!(fields.model, "llama3");
    assert!(fields.stream);
    assert_eq!(&body[fields.model_span.clone()], "\"llama3\"");
    assert_eq!(model_of(" {\n\"model\" : \"a/b:c\" } ").unwrap(), "a/b:c");
    assert!(!scan(br#"{"model":"m","stream":false}"#).unwrap().stream);
    assert!(!scan(br#"{"model":"m","stream":null}"#).unwrap().stream);
}

/// Fields whose type decides what is charged are typed strictly: a
/// stream the upstream would run must never pass as "no stream" here.
#[test]
fn stream_fields_and_output_bounds_are_typed() {
    let invalid = |body: &str| scan(body.as_bytes()).err();
    for stream in ["1", "\"true\"", "{}", "[true]"] {
        let body = format!(r#"{{"model":"m","stream":{stream}}}"#);
        assert_eq!(invalid(&body), Some(GatewayError::InvalidField("stream", "must be a boolean")), "{body}");
    }
    assert_eq!(
        invalid(r#"{"model":"m","stream_options":"x"}"#),
        Some(GatewayError::InvalidField("stream_options", "must be an object"))
    );
    assert_eq!(invalid(r#"{"model":""}"#), Some(GatewayError::InvalidField("model", "must not be empty")));
    let fields =
        scan(br#"{"model":"m","stream":true,"stream_options":null,"max_tokens":64,"max_completion_tokens":128}"#)
            .unwrap();
    assert_eq!((fields.stream, fields.max_tokens), (true, Some(128)));
    assert_eq!(fields.stream_options.map(|span| span.len()), Some(4), "null is kept: the gateway replaces it");
    assert_eq!(scan(br#"{"model":"m","max_tokens":null}"#).unwrap().max_tokens, None);
    assert!(invalid(r#"{"model":"m","max_tokens":-1}"#).is_some());
    assert!(invalid(r#"{"model":"m","max_output_tokens":"9"}"#).is_some());
    // Completions asked for: the larger of `n` and `best_of`, 1 without.
    assert_eq!(scan(br#"{"model":"m"}"#).unwrap().choices, 1);
    assert_eq!(scan(br#"{"model":"m","n":4}"#).unwrap().choices, 4);
    assert_eq!(scan(br#"{"model":"m","best_of":5,"n":2}"#).unwrap().choices, 5);
    assert_eq!(scan(br#"{"model":"m","n":null}"#).unwrap().choices, 1);
    assert!(invalid(r#"{"model":"m","n":"4"}"#).is_some());
    assert!(invalid(r#"{"model":"m","best_of":-2}"#).is_some());
}

#[test]
fn unescapes_keys_and_values() {
    assert_eq!(model_of(r#"{"\u006dodel":"x\u0041"}"#).unwrap(), "xA");
    assert_eq!(model_of(r#"{"\u006dodel":"a","model":"b"}"#), Err(GatewayError::DuplicateModel));
}

/// Keys are compared as bytes: one that is not UTF-8 is a key the gateway
/// does not know, skipped as any other (the upstream's parser refuses it).
/// The model's name is text, and must be UTF-8.
#[test]
fn keys_are_bytes_and_the_model_is_text() {
    let body = b"{\"mod\xffel\":1,\"model\":\"m\"}";
    assert_eq!(scan(body).map(|fields| fields.model.into_owned()), Ok("m".to_owned()));
    assert_eq!(scan(b"{\"model\":\"m\xff\"}").err(), Some(GatewayError::InvalidJson("string is not UTF-8")));
}

#[test]
fn refuses_what_routing_cannot_trust() {
    let cases: &[(&str, GatewayError)] = &[
        ("", GatewayError::InvalidJson("unexpected end of input")),
        ("not json", GatewayError::InvalidJson("invalid literal")),
        ("[1,2]", GatewayError::NotAnObject),
        ("\"text\"", GatewayError::NotAnObject),
        ("{}", GatewayError::MissingModel),
        (r#"{"messages":[]}"#, GatewayError::MissingModel),
        (r#"{"model":42}"#, GatewayError::ModelNotString),
        (r#"{"model":null,"x":1}"#, GatewayError::ModelNotString),
        (r#"{"model":"a","model":"b"}"#, GatewayError::DuplicateModel),
        (r#"{"model":"a""#, GatewayError::InvalidJson("expected ',' or '}' in object")),
        (r#"{"model":"a"} x"#, GatewayError::InvalidJson("trailing characters after the JSON value")),
        (r#"{"model":"a","n":01}"#, GatewayError::InvalidJson("expected ',' or '}' in object")),
        (r#"{"model":"a","n":1.}"#, GatewayError::InvalidJson("invalid number")),
        (r#"{"model":"a","s":"\x"}"#, GatewayError::InvalidJson("invalid escape in string")),
        (r#"{"model":"unterminated}"#, GatewayError::InvalidJson("unterminated string")),
        (r#"{"model":42,"#, GatewayError::InvalidJson("expected a string")),
    ];
    for (body, expected) in cases {
        assert_eq!(scan(body.as_bytes()).map(|f| f.model.into_owned()).as_ref(), Err(expected), "{body}");
    }
}

#[test]
fn deep_nesting_is_refused_without_recursing_forever() {
    let deep = format!("{{\"model\":\"m\",\"x\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    assert_eq!(scan(deep.as_bytes()), Err(GatewayError::InvalidJson("nested too deeply")));
    let fine = format!("{{\"model\":\"m\",\"x\":{}{}}}", "[".repeat(100), "]".repeat(100));
    assert_eq!(model_of(&fine).unwrap(), "m");
}

#[test]
fn agrees_with_serde_json_on_valid_documents() {
    let documents = [
        r#"{"model":"m","temperature":-0.5e-3,"n":0,"stop":null,"logit_bias":{"1":-100},"tools":[true,false,[],{}]}"#,
        r#"{"input":"caf\u00e9 ☕","model":"embed-1"}"#,
    ];
    for document in documents {
        let value: serde_json::Value = serde_json::from_str(document).unwrap();
        assert_eq!(model_of(document).unwrap(), value["model"].as_str().unwrap());
    }
}

/// OpenAI's `user` is read as said (unescaped, cut at 256 bytes on a
/// character boundary) when it is a string, and never refuses a request.
#[test]
fn the_clients_user_is_read_as_said_and_never_refuses() {
    let said = |body: &str| scan(body.as_bytes()).unwrap().client_user.map(|user| user.into_owned());
    assert_eq!(said(r#"{"model":"m","user":"ops\u00e9-1"}"#).as_deref(), Some("opsé-1"));
    assert_eq!(said(r#"{"model":"m"}"#), None);
    assert_eq!(said(r#"{"model":"m","user":42}"#), None, "not a string: not recorded, not refused");
    let long = said(&format!(r#"{{"model":"m","user":"{}"}}"#, "é".repeat(200))).unwrap();
    assert!(long.len() <= MAX_CLIENT_USER_BYTES && long.len() >= MAX_CLIENT_USER_BYTES - 1, "{}", long.len());
}
