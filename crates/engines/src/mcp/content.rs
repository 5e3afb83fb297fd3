//! A `tools/call` result as the model and the channel get it: text content
//! to the model, each image written as a file in the run's directory
//! (`mcp-images/`) and handed to the channel with the answer
//! (`auto_send_files`), what the model cannot read named in a line.

use std::io::Write;
use std::path::Path;

use base64::Engine as _;
use lemon_core::contain::Access;
use lemon_core::tool::{ToolContext, ToolOutput};
use serde_json::{json, Value};

/// The most text of one result the model reads.
pub(crate) const MAX_TEXT_CHARS: usize = 64 * 1024;
/// The largest image (base64) written; a larger one is left out.
const MAX_IMAGE_BASE64: usize = 28 * 1024 * 1024;
/// Images written of one result at most.
const MAX_IMAGES: usize = 8;
/// Where images go, under the run's directory.
pub(crate) const IMAGE_DIR: &str = "mcp-images";

/// The output of a call of `server`'s `tool` that answered `result`.
pub(crate) fn output(server: &str, tool: &str, result: Value, ctx: &ToolContext) -> ToolOutput {
    let Value::Object(result) = result else {
        return ToolOutput::error(format!(
            "MCP server {server} answered the call with something that is not a tool result"
        ));
    };
    let content = match result.get("content") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items.clone(),
        Some(_) => {
            return ToolOutput::error(format!(
            "MCP server {server} answered the call with a malformed result (content is not a list)"
        ))
        }
    };
    let is_error = result.get("isError").and_then(Value::as_bool).unwrap_or(false);
    let mut parts: Vec<String> = Vec::new();
    let mut files: Vec<Value> = Vec::new();
    for item in &content {
        let kind = item.get("type").and_then(Value::as_str).unwrap_or_default();
        let text = |key: &str| item.get(key).and_then(Value::as_str).unwrap_or_default();
        match kind {
            "text" => parts.push(text("text").to_owned()),
            "image" => parts.push(image(server, tool, item, files.len(), ctx, &mut files)),
            "audio" => parts.push(format!("[{} audio left out]", mime_or(text("mimeType")))),
            "resource_link" => {
                parts.push(format!("[resource link: {} {}]", text("name"), text("uri")))
            }
            "resource" => {
                let resource = item.get("resource").cloned().unwrap_or(Value::Null);
                let field = |key: &str| {
                    resource.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
                };
                match resource.get("text").and_then(Value::as_str) {
                    Some(body) => parts.push(format!("[resource {}]\n{body}", field("uri"))),
                    None => parts.push(format!(
                        "[resource {} ({}) left out: not text]",
                        field("uri"),
                        mime_or(&field("mimeType"))
                    )),
                }
            }
            other => parts.push(format!("[content of type {other:?} left out]")),
        }
    }
    if parts.is_empty() {
        if let Some(structured) = result.get("structuredContent").filter(|v| !v.is_null()) {
            parts.push(structured.to_string());
        }
    }
    let mut text = parts.join("\n");
    if let Some((at, _)) = text.char_indices().nth(MAX_TEXT_CHARS) {
        let left = text[at..].chars().count();
        text.truncate(at);
        text.push_str(&format!("\n[cut: {left} more characters]"));
    }
    if text.is_empty() {
        text =
            if is_error { "the tool failed without saying why" } else { "(no output)" }.to_owned();
    }
    let mut details = json!({ "server": server, "tool": tool });
    if !files.is_empty() {
        details["auto_send_files"] = Value::Array(files);
    }
    if is_error {
        let mut output = ToolOutput::error(text);
        output.details["server"] = json!(server);
        output.details["tool"] = json!(tool);
        output
    } else {
        ToolOutput::ok(text, details)
    }
}

fn mime_or(mime: &str) -> &str {
    if mime.is_empty() {
        "untyped"
    } else {
        mime
    }
}

/// Writes an image content item under [`IMAGE_DIR`]; the line the model reads.
fn image(
    server: &str,
    tool: &str,
    item: &Value,
    index: usize,
    ctx: &ToolContext,
    files: &mut Vec<Value>,
) -> String {
    let mime = item.get("mimeType").and_then(Value::as_str).unwrap_or_default();
    let data = item.get("data").and_then(Value::as_str).unwrap_or_default();
    let Some(ext) = image_extension(mime) else {
        return format!("[{} image left out: not a known image type]", mime_or(mime));
    };
    if index >= MAX_IMAGES {
        return format!("[{mime} image left out: more than {MAX_IMAGES} images]");
    }
    if data.len() > MAX_IMAGE_BASE64 {
        return format!(
            "[{mime} image left out: larger than {} MiB]",
            MAX_IMAGE_BASE64 / 1024 / 1024 * 3 / 4
        );
    }
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(data.trim()) else {
        return format!("[{mime} image left out: its data is not base64]");
    };
    let call: String = ctx
        .call_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(40)
        .collect();
    let filename = format!("{server}__{tool}-{call}-{}.{ext}", index + 1);
    let relative = Path::new(IMAGE_DIR).join(&filename);
    match write_new(ctx, &relative, &bytes) {
        Ok(path) => {
            files.push(json!({ "path": path.display().to_string(), "filename": filename, "caption": Value::Null }));
            format!("[{mime} image saved as {}; it is sent with the answer]", relative.display())
        }
        Err(why) => format!("[{mime} image not saved: {why}]"),
    }
}

/// Writes `bytes` as a new file at `relative` in the run's reach.
fn write_new(
    ctx: &ToolContext,
    relative: &Path,
    bytes: &[u8],
) -> Result<std::path::PathBuf, String> {
    let reach = ctx.reach();
    let path = reach.resolve(relative).map_err(|err| err.to_string())?;
    let mut file = reach.open(&path, Access::CreateNew).map_err(|err| err.to_string())?;
    file.write_all(bytes).map_err(|err| err.to_string())?;
    Ok(path)
}

fn image_extension(mime: &str) -> Option<&'static str> {
    Some(match mime.to_ascii_lowercase().as_str() {
        "image/png" => "png",
        "image/jpeg" | "image/jpg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/bmp" => "bmp",
        "image/svg+xml" => "svg",
        "image/tiff" => "tiff",
        _ => return None,
    })
}
