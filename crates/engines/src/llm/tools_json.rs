//! The `tools` array of a client's requests, serialised once per set of specs.
//!
//! A native run offers every model request the same specs (one shared `Arc`,
//! kept per set of tools offered), and serialising their JSON schemas was most
//! of the cost of building a request. Each client keeps the array it sends for
//! the sets it saw last and embeds it in the request as raw JSON.

use std::sync::{Arc, Mutex, PoisonError};

use lemon_core::tool::ToolSpec;
use serde::Serialize;
use serde_json::value::RawValue;

/// How many sets of tool specs keep their serialised form: one per kind of
/// session offered different gateway tools (a Telegram chat, a webhook…).
pub(crate) const TOOLS_KEPT: usize = 4;

/// How a protocol writes a set of specs as its `tools` array.
pub(crate) type WireTools = fn(&[ToolSpec]) -> Option<Box<RawValue>>;

/// `specs` as a `tools` array of the entries `wire` makes of each, for a
/// client's [`WireTools`].
pub(crate) fn array<'a, W: Serialize>(
    specs: &'a [ToolSpec],
    wire: impl Fn(&'a ToolSpec) -> W,
) -> Option<Box<RawValue>> {
    let tools: Vec<W> = specs.iter().map(wire).collect();
    // Serialising borrowed strings and `Value`s into a string cannot fail.
    serde_json::value::to_raw_value(&tools).ok()
}

/// The serialised arrays of the sets of specs used last.
#[derive(Debug)]
pub(crate) struct ToolsJson {
    /// The most recently used first.
    recent: Mutex<Vec<KeptTools>>,
    wire: WireTools,
}

/// A set of specs and its serialised array.
type KeptTools = (Arc<[ToolSpec]>, Arc<RawValue>);

impl ToolsJson {
    /// An empty cache of the arrays `wire` writes.
    pub(crate) fn new(wire: WireTools) -> Self {
        ToolsJson { recent: Mutex::default(), wire }
    }

    /// The array for `specs`; `None` when there are none.
    pub(crate) fn of(&self, specs: &Arc<[ToolSpec]>) -> Option<Arc<RawValue>> {
        if specs.is_empty() {
            return None;
        }
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        // The `Arc` held here keeps the address from being reused by other specs.
        if let Some(at) = recent.iter().position(|(kept, _)| Arc::ptr_eq(kept, specs)) {
            let entry = recent.remove(at);
            let json = Arc::clone(&entry.1);
            recent.insert(0, entry);
            return Some(json);
        }
        let json: Arc<RawValue> = Arc::from((self.wire)(specs)?);
        recent.insert(0, (Arc::clone(specs), Arc::clone(&json)));
        recent.truncate(TOOLS_KEPT);
        Some(json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn names_only(specs: &[ToolSpec]) -> Option<Box<RawValue>> {
        array(specs, |tool| tool.name.as_str())
    }

    #[test]
    fn each_set_of_tools_is_sent_as_its_own_even_when_sets_take_turns() {
        let set = |names: &[&str]| -> Arc<[ToolSpec]> {
            names
                .iter()
                .map(|name| ToolSpec {
                    name: (*name).to_owned(),
                    description: format!("the {name} tool"),
                    parameters: json!({"type": "object"}),
                })
                .collect()
        };
        let names = |json: Option<Arc<RawValue>>| -> Value {
            serde_json::from_str(json.unwrap().get()).unwrap()
        };
        let cache = ToolsJson::new(names_only);
        let sets: Vec<Arc<[ToolSpec]>> =
            (0..TOOLS_KEPT + 2).map(|n| set(&[&format!("tool_{n}"), "read"])).collect();
        for round in 0..3 {
            for (n, specs) in sets.iter().enumerate() {
                assert_eq!(names(cache.of(specs)), json!([format!("tool_{n}"), "read"]), "{round}");
            }
        }
        // Equal specs in another allocation are serialised again, alike.
        assert_eq!(names(cache.of(&set(&["tool_0", "read"]))), json!(["tool_0", "read"]));
        assert!(cache.of(&set(&[])).is_none(), "no tools, no array");
    }
}
