//! `multipart/form-data` as the Bot API takes file uploads: text fields and at
//! most one file part.

use super::Upload;

/// A body's text fields (name, value) and its file.
pub(super) type Parts = (Vec<(String, String)>, Option<Upload>);

/// The text fields and the file of a body, or `None` when it is not a
/// well-formed multipart body with this boundary (or has two files).
pub(super) fn parse(body: &[u8], boundary: &str) -> Option<Parts> {
    let delimiter = format!("--{boundary}");
    let mut fields = Vec::new();
    let mut upload = None;
    let mut rest = body.strip_prefix(delimiter.as_bytes())?;
    loop {
        if rest.starts_with(b"--") {
            return Some((fields, upload));
        }
        rest = rest.strip_prefix(b"\r\n")?;
        let head_end = find(rest, b"\r\n\r\n")?;
        let head = std::str::from_utf8(&rest[..head_end]).ok()?;
        rest = &rest[head_end + 4..];
        let next = find(rest, format!("\r\n{delimiter}").as_bytes())?;
        let content = &rest[..next];
        rest = &rest[next + 2 + delimiter.len()..];
        let mut name = None;
        let mut filename = None;
        let mut content_type = "application/octet-stream".to_owned();
        for line in head.split("\r\n") {
            let (key, value) = line.split_once(':')?;
            if key.eq_ignore_ascii_case("content-disposition") {
                name = quoted(value, "name");
                filename = quoted(value, "filename");
            } else if key.eq_ignore_ascii_case("content-type") {
                value.trim().clone_into(&mut content_type);
            }
        }
        let name = name?;
        match filename {
            Some(filename) => {
                if upload.is_some() {
                    return None;
                }
                upload =
                    Some(Upload { field: name, filename, content_type, content: content.to_vec() });
            }
            None => fields.push((name, String::from_utf8(content.to_vec()).ok()?)),
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

/// `key="value"` of a header's parameters.
fn quoted(header: &str, key: &str) -> Option<String> {
    header.split(';').find_map(|part| {
        let (k, v) = part.trim().split_once('=')?;
        (k == key).then(|| v.trim_matches('"').to_owned())
    })
}
