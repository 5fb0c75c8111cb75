#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use super::*;

fn form(parts: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, value) in parts {
        body.extend_from_slice(format!("--XyZ\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes());
        body.extend_from_slice(value);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"--XyZ--\r\n");
    body
}

/// What a scanner makes of `pieces` fed in turn: the fields, or the
/// error's code and message.
fn read(pieces: &[&[u8]]) -> Result<FormFields, String> {
    let mut scanner = FormScanner::new(b"XyZ");
    for piece in pieces {
        scanner.feed(piece).map_err(|error| format!("{}: {error}", error.code()))?;
    }
    scanner.finish().map_err(|error| format!("{}: {error}", error.code()))
}

/// Forms every branch of the grammar takes: read well, and refused for
/// each reason, with delimiter-like bytes inside values.
fn forms() -> Vec<Vec<u8>> {
    let file: &[u8] = b"RIFF\0\r\n--XyQ\r\n-XyZ\r\n--Xy\0\r\r\n--";
    let long_model = "m".repeat(257);
    let mut cases = vec![
        form(&[("model", b"whisper-1"), ("file", file), ("stream", b"TRUE")]),
        form(&[("file", file), ("model", b"whisper-1")]),
        form(&[("model", b""), ("file", file)]),
        form(&[("model", long_model.as_bytes())]),
        form(&[("model", b"a"), ("model", b"b")]),
        form(&[("model", b"a"), ("stream", b"maybe")]),
        form(&[("model", b"a"), ("stream", b"true"), ("stream", b"true")]),
        form(&[("model", b"\xff\xfe")]),
        form(&[("file", file)]),
        b"--XyZ\r\n\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--XyZ--".to_vec(),
        b"--XyZgarbage".to_vec(),
        b"preamble--XyZ".to_vec(),
        b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--XyZ--\r\nmore".to_vec(),
        b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm".to_vec(),
    ];
    let mut long_headers = b"--XyZ\r\nX: ".to_vec();
    long_headers.extend(std::iter::repeat_n(b'a', MAX_PART_HEADERS));
    long_headers.extend_from_slice(b"\r\n\r\nv\r\n--XyZ--");
    cases.push(long_headers);
    let many: Vec<(&str, &[u8])> = (0..=MAX_PARTS).map(|_| ("x", b"1".as_slice())).collect();
    cases.push(form(&many));
    cases
}

/// Whatever its split points, a form is read as it is read whole: the
/// same fields, or the same refusal.
#[test]
fn a_form_split_anywhere_is_read_as_it_is_whole() {
    for body in forms() {
        let whole = read(&[&body]);
        for at in 0..=body.len() {
            assert_eq!(
                read(&[&body[..at], &body[at..]]),
                whole,
                "split at {at} of {:?}",
                String::from_utf8_lossy(&body)
            );
        }
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(read(&bytes), whole, "byte by byte: {:?}", String::from_utf8_lossy(&body));
    }
}

#[test]
fn the_fields_and_refusals_are_those_of_the_form() {
    let read_whole = |body: &[u8]| read(&[body]);
    let fields = read_whole(&forms()[0]).unwrap();
    assert_eq!((fields.model.as_str(), fields.stream), ("whisper-1", true));
    assert_eq!(&forms()[0][fields.model_span], b"whisper-1");
    let after_file = read_whole(&forms()[1]).unwrap();
    assert_eq!(&forms()[1][after_file.model_span], b"whisper-1");
    let codes: Vec<String> = forms()[2..]
        .iter()
        .map(|body| read_whole(body).unwrap_err().split(':').next().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        codes,
        [
            "invalid_model",
            "invalid_model",
            "duplicate_model",
            "invalid_type",
            "invalid_form",
            "invalid_model",
            "missing_model",
            "invalid_form",
            "invalid_form",
            "invalid_form",
            "invalid_form",
            "invalid_form",
            "invalid_form",
            "invalid_form",
        ]
    );
}

/// A streamed form's model is known as soon as its part ends, before
/// the file after it; a file is searched, never held.
#[test]
fn the_model_is_known_when_its_part_ends_and_a_file_is_not_held() {
    let model: &[u8] = b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1";
    let file: &[u8] = b"\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n";
    let mut scanner = FormScanner::new(b"XyZ");
    scanner.feed(model).unwrap();
    assert!(scanner.fields_so_far().is_none(), "the value may go on");
    scanner.feed(file).unwrap();
    assert_eq!(scanner.fields_so_far().unwrap().unwrap().model, "whisper-1");
    for _ in 0..1_000 {
        scanner.feed(&[7_u8; 16 * 1024]).unwrap();
    }
    assert!(scanner.held.len() < 16 && scanner.captured.is_empty(), "held {}", scanner.held.len());
    assert_eq!(scanner.offset, model.len() + file.len() + 16_384_000);
    scanner.feed(b"\r\n--XyZ--\r\n").unwrap();
    assert_eq!(scanner.finish().unwrap().model, "whisper-1");
}
