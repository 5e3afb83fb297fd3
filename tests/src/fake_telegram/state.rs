//! Everything the fake Telegram knows, and the Bot API methods over it. All of
//! it is synchronous: the server locks the state for one short section per step.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::limits::{retry_after_secs, Enforcement, Limiter, RateLimits};
use super::types::{Command, Entity, SetMyCommands, ENTITY_TYPES};
use super::{
    BotFile, BotMessage, Call, ChatKind, ChatSpec, Fault, InjectedMessage, Reply, Upload, Violation,
};

/// The description Telegram gives an edit that changes nothing.
pub(super) const NOT_MODIFIED: &str = "message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message";
/// What the earlier of two concurrent pollers is told.
const CONFLICT: &str =
    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running";
/// Most UTF-16 code units in a message text.
const MAX_TEXT_UTF16: usize = 4096;
/// The first update id of every bot: large, like Telegram's, so that update ids
/// and message ids are never mistaken for each other.
const FIRST_UPDATE_ID: i64 = 730_000_001;
/// The first message id of every chat, shared by the users' and the bots'
/// messages as in Telegram.
const FIRST_MESSAGE_ID: i64 = 5_001;

/// The fake's whole state.
#[derive(Debug)]
pub(super) struct State {
    clock: Clock,
    limits: RateLimits,
    bots: Vec<BotState>,
    chats: BTreeMap<i64, ChatState>,
    calls: Vec<Call>,
    violations: Vec<Violation>,
    files: Vec<BotFile>,
    /// Files users sent, served by `getFile` and the download route.
    pub(super) served: super::files::Served,
}

/// Real time, or a start instant plus however far the test moved it.
#[derive(Debug)]
struct Clock {
    start: Instant,
    manual_offset: Option<Duration>,
}

/// One bot's account: identity, update queue, poller, commands, faults, limits.
#[derive(Debug)]
struct BotState {
    token: String,
    id: i64,
    username: String,
    /// Unconfirmed updates, oldest first, each with its `update_id`.
    updates: VecDeque<(i64, Value)>,
    next_update_id: i64,
    /// The highest offset a poll passed; updates below it are gone.
    confirmed_offset: i64,
    /// Bumped by every `getUpdates`, so an earlier poll sees it was superseded.
    poll_generation: u64,
    waiting_polls: usize,
    /// The sticky `allowed_updates`; empty means every kind.
    allowed_updates: Vec<String>,
    commands: Vec<Command>,
    /// Faults for the next calls, by lowercase method name.
    faults: HashMap<String, VecDeque<Fault>>,
    limiter: Limiter,
}

/// A chat and its messages (users' and bots').
#[derive(Debug)]
struct ChatState {
    id: i64,
    kind: ChatKind,
    title: Option<String>,
    username: Option<String>,
    is_forum: bool,
    /// Forum topics messages were injected into.
    topics: BTreeSet<i64>,
    next_message_id: i64,
    messages: BTreeMap<i64, StoredMessage>,
}

#[derive(Debug)]
struct StoredMessage {
    /// The message as the Bot API shows it.
    json: Value,
    /// Set for messages a bot sent.
    bot: Option<BotMessage>,
}

/// A `getUpdates` call between its start and its answer.
#[derive(Debug)]
pub(super) struct Poll {
    generation: u64,
    limit: usize,
}

impl State {
    pub(super) fn new(
        bots: Vec<(String, i64, String)>,
        limits: RateLimits,
        manual_clock: bool,
    ) -> Self {
        let bots = bots
            .into_iter()
            .map(|(token, id, username)| BotState {
                token,
                id,
                username,
                updates: VecDeque::new(),
                next_update_id: FIRST_UPDATE_ID,
                confirmed_offset: 0,
                poll_generation: 0,
                waiting_polls: 0,
                allowed_updates: Vec::new(),
                commands: Vec::new(),
                faults: HashMap::new(),
                limiter: Limiter::default(),
            })
            .collect();
        State {
            clock: Clock {
                start: Instant::now(),
                manual_offset: manual_clock.then_some(Duration::ZERO),
            },
            limits,
            bots,
            chats: BTreeMap::new(),
            calls: Vec::new(),
            violations: Vec::new(),
            files: Vec::new(),
            served: super::files::Served::default(),
        }
    }

    // ---- Observation ----

    pub(super) fn now(&self) -> Instant {
        match self.clock.manual_offset {
            Some(offset) => self.clock.start + offset,
            None => Instant::now(),
        }
    }

    pub(super) fn bot_identity(&self, bot: usize) -> (i64, String) {
        (self.bots[bot].id, self.bots[bot].username.clone())
    }

    pub(super) fn bot_index(&self, bot_id: i64) -> Option<usize> {
        self.bots.iter().position(|b| b.id == bot_id)
    }

    pub(super) fn bot_by_token(&self, token: &str) -> Option<usize> {
        self.bots.iter().position(|b| b.token == token)
    }

    pub(super) fn calls(&self) -> &[Call] {
        &self.calls
    }

    /// The files bot `bot` uploaded to `chat_id`, oldest first.
    pub(super) fn bot_files(&self, bot: usize, chat_id: i64) -> Vec<&BotFile> {
        let id = self.bots[bot].id;
        self.files.iter().filter(|f| f.bot_id == id && f.chat_id == chat_id).collect()
    }

    pub(super) fn violations(&self) -> &[Violation] {
        &self.violations
    }

    pub(super) fn bot_messages(&self, bot: usize, chat_id: i64) -> Vec<&BotMessage> {
        let bot_id = self.bots[bot].id;
        self.chats
            .get(&chat_id)
            .map(|chat| {
                chat.messages
                    .values()
                    .filter_map(|m| m.bot.as_ref())
                    .filter(|m| m.bot_id == bot_id)
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(super) fn commands(&self, bot: usize) -> &[Command] {
        &self.bots[bot].commands
    }

    pub(super) fn confirmed_offset(&self, bot: usize) -> i64 {
        self.bots[bot].confirmed_offset
    }

    pub(super) fn pending_updates(&self, bot: usize) -> Vec<&Value> {
        self.bots[bot].updates.iter().map(|(_, update)| update).collect()
    }

    pub(super) fn waiting_polls(&self, bot: usize) -> usize {
        self.bots[bot].waiting_polls
    }

    // ---- The test's side ----

    pub(super) fn advance_clock(&mut self, by: Duration) {
        match &mut self.clock.manual_offset {
            Some(offset) => *offset += by,
            None => panic!("advance_clock needs a fake built with manual_clock()"),
        }
    }

    pub(super) fn push_fault(&mut self, bot: usize, method: &str, fault: Fault) {
        self.bots[bot].faults.entry(method.to_ascii_lowercase()).or_default().push_back(fault);
    }

    /// The next fault of `method` if it acts on the connection (latency, a drop,
    /// a hang) rather than on the answer; answer faults stay queued.
    pub(super) fn take_connection_fault(&mut self, bot: usize, method: &str) -> Option<Fault> {
        let queue = self.bots[bot].faults.get_mut(&method.to_ascii_lowercase())?;
        if queue.front().is_some_and(Fault::is_connection_fault) {
            queue.pop_front()
        } else {
            None
        }
    }

    pub(super) fn add_chat(&mut self, spec: &ChatSpec) {
        self.chat_entry(spec);
    }

    /// The chat `spec` names, created or updated to match it.
    fn chat_entry(&mut self, spec: &ChatSpec) -> &mut ChatState {
        let chat = self.chats.entry(spec.id).or_insert_with(|| ChatState {
            id: spec.id,
            kind: spec.kind,
            title: None,
            username: None,
            is_forum: false,
            topics: BTreeSet::new(),
            next_message_id: FIRST_MESSAGE_ID,
            messages: BTreeMap::new(),
        });
        chat.kind = spec.kind;
        chat.title.clone_from(&spec.title);
        chat.username.clone_from(&spec.username);
        chat.is_forum = spec.is_forum;
        if let (true, Some(thread)) = (spec.is_topic_message, spec.message_thread_id) {
            chat.topics.insert(thread);
        }
        chat
    }

    pub(super) fn inject_text(
        &mut self,
        bot: usize,
        spec: &ChatSpec,
        from: i64,
        text: &str,
        reply_to: Option<i64>,
    ) -> InjectedMessage {
        let (message_id, mut message) = self.user_message(spec, from);
        message.insert("text".into(), json!(text));
        if let Some(entity) = command_entity(text) {
            message.insert("entities".into(), json!([entity]));
        }
        if let Some(reply_to) = reply_to {
            let target = self
                .chats
                .get(&spec.id)
                .and_then(|chat| chat.messages.get(&reply_to))
                .unwrap_or_else(|| {
                    panic!("chat {} has no message {reply_to} to reply to", spec.id)
                });
            message.insert("reply_to_message".into(), embedded(&target.json));
        }
        self.deliver(bot, spec, message_id, message)
    }

    /// User `from` presses a button with `data` on the bot's message
    /// `message_id` of `spec`: a `callback_query` update embedding the
    /// message as it stands; returns the update id.
    pub(super) fn press_button(
        &mut self,
        bot: usize,
        spec: &ChatSpec,
        from: i64,
        message_id: i64,
        data: &str,
    ) -> i64 {
        let message = self
            .chats
            .get(&spec.id)
            .and_then(|chat| chat.messages.get(&message_id))
            .map(|stored| stored.json.clone())
            .unwrap_or_else(|| panic!("chat {} has no message {message_id}", spec.id));
        let bot = &mut self.bots[bot];
        let update_id = bot.next_update_id;
        bot.next_update_id += 1;
        let query = json!({
            "id": format!("cbq-{update_id}"),
            "from": user_json(from),
            "message": message,
            "chat_instance": format!("ci-{}", spec.id),
            "data": data,
        });
        if bot.allowed_updates.is_empty()
            || bot.allowed_updates.iter().any(|k| k == "callback_query")
        {
            bot.updates
                .push_back((update_id, json!({ "update_id": update_id, "callback_query": query })));
        }
        update_id
    }

    pub(super) fn inject_photo(
        &mut self,
        bot: usize,
        spec: &ChatSpec,
        from: i64,
        caption: Option<&str>,
    ) -> InjectedMessage {
        let (message_id, mut message) = self.user_message(spec, from);
        let file = |size: i64, n: i64| {
            json!({
                "file_id": format!("fake-photo-{}-{message_id}-{n}", spec.id),
                "file_unique_id": format!("fake-unique-{}-{message_id}-{n}", spec.id),
                "width": size,
                "height": size,
                "file_size": size * 40,
            })
        };
        message.insert("photo".into(), json!([file(90, 0), file(320, 1), file(1280, 2)]));
        if let Some(caption) = caption {
            message.insert("caption".into(), json!(caption));
        }
        self.deliver(bot, spec, message_id, message)
    }

    /// A message from `from` in `spec` with `fields` (a `photo`, a
    /// `document`, a `caption`, …) besides the usual ones.
    pub(super) fn inject_fields(
        &mut self,
        bot: usize,
        spec: &ChatSpec,
        from: i64,
        fields: Map<String, Value>,
    ) -> InjectedMessage {
        let (message_id, mut message) = self.user_message(spec, from);
        message.extend(fields);
        self.deliver(bot, spec, message_id, message)
    }

    pub(super) fn inject_raw(&mut self, bot: usize, mut update: Map<String, Value>) -> i64 {
        let bot = &mut self.bots[bot];
        let update_id = bot.next_update_id;
        bot.next_update_id += 1;
        update.insert("update_id".into(), json!(update_id));
        bot.updates.push_back((update_id, Value::Object(update)));
        update_id
    }

    /// A new message from user `from` in `spec`, without content yet. Messages in
    /// a forum topic answer the topic's first message, as Telegram shows them.
    fn user_message(&mut self, spec: &ChatSpec, from: i64) -> (i64, Map<String, Value>) {
        let chat = self.chat_entry(spec);
        let message_id = chat.take_message_id();
        let chat_json = chat.json();
        let date = unix_now();
        let mut message = Map::new();
        message.insert("message_id".into(), json!(message_id));
        if spec.kind == ChatKind::Channel {
            message.insert("sender_chat".into(), chat_json.clone());
        } else {
            message.insert("from".into(), user_json(from));
        }
        message.insert("chat".into(), chat_json.clone());
        message.insert("date".into(), json!(date));
        if let Some(thread) = spec.message_thread_id {
            message.insert("message_thread_id".into(), json!(thread));
            if spec.is_topic_message {
                message.insert("is_topic_message".into(), json!(true));
                message.insert(
                    "reply_to_message".into(),
                    json!({
                        "message_id": thread,
                        "from": user_json(from),
                        "chat": chat_json,
                        "date": date,
                        "message_thread_id": thread,
                        "is_topic_message": true,
                        "forum_topic_created": { "name": format!("Topic {thread}"), "icon_color": 7_322_096 },
                    }),
                );
            }
        }
        (message_id, message)
    }

    /// Stores an injected message and queues the update carrying it.
    fn deliver(
        &mut self,
        bot: usize,
        spec: &ChatSpec,
        message_id: i64,
        message: Map<String, Value>,
    ) -> InjectedMessage {
        let message = Value::Object(message);
        if let Some(chat) = self.chats.get_mut(&spec.id) {
            chat.messages.insert(message_id, StoredMessage { json: message.clone(), bot: None });
        }
        let kind = if spec.kind == ChatKind::Channel { "channel_post" } else { "message" };
        let bot = &mut self.bots[bot];
        let update_id = bot.next_update_id;
        bot.next_update_id += 1;
        // Telegram does not even create updates of kinds the bot did not ask for.
        if bot.allowed_updates.is_empty() || bot.allowed_updates.iter().any(|k| k == kind) {
            bot.updates.push_back((update_id, json!({ "update_id": update_id, kind: message })));
        }
        InjectedMessage { update_id, message_id }
    }

    // ---- The bot's side ----

    /// Records a call on arrival; returns its index for [`State::finish_call`].
    pub(super) fn record_call(
        &mut self,
        bot: Option<usize>,
        method: &str,
        params: Map<String, Value>,
        status: Option<u16>,
    ) -> usize {
        let at = self.now();
        self.calls.push(Call {
            bot_id: bot.map(|b| self.bots[b].id),
            method: method.to_owned(),
            params: Value::Object(params),
            at,
            status,
        });
        self.calls.len() - 1
    }

    pub(super) fn finish_call(&mut self, call: usize, status: u16) {
        if let Some(call) = self.calls.get_mut(call) {
            call.status = Some(status);
        }
    }

    /// Answers every method but `getUpdates`.
    pub(super) fn answer(
        &mut self,
        bot: usize,
        method: &str,
        params: &Map<String, Value>,
        upload: Option<Upload>,
    ) -> Reply {
        let method = method.to_ascii_lowercase();
        if let Some(fault) = self.bots[bot].faults.get_mut(&method).and_then(VecDeque::pop_front) {
            return fault.reply();
        }
        let result = match method.as_str() {
            "getme" => Ok(self.get_me(bot)),
            "deletewebhook" => {
                if param_bool(params, "drop_pending_updates") {
                    self.bots[bot].updates.clear();
                }
                Ok(json!(true))
            }
            "setmycommands" => self.set_my_commands(bot, params),
            "sendchataction" => self.resolve_chat(params).map(|_| json!(true)),
            "answercallbackquery" => {
                match params.get("callback_query_id").and_then(Value::as_str) {
                    Some(id) if id.starts_with("cbq-") => Ok(json!(true)),
                    _ => Err(Reply::bad_request(
                        "query is too old and response timeout expired or query ID is invalid",
                    )),
                }
            }
            "sendmessage" => self.send_message(bot, params),
            "editmessagetext" => self.edit_message_text(bot, params),
            "sendphoto" => self.send_file(bot, "sendPhoto", "photo", params, upload),
            "senddocument" => self.send_file(bot, "sendDocument", "document", params, upload),
            "getfile" => self.served.get_file(params),
            _ => Err(Reply::error(404, "Not Found")),
        };
        result.map_or_else(|reply| reply, Reply::Ok)
    }

    fn get_me(&self, bot: usize) -> Value {
        let mut user = self.bot_user(bot);
        user["can_join_groups"] = json!(true);
        user["can_read_all_group_messages"] = json!(false);
        user["supports_inline_queries"] = json!(false);
        user
    }

    fn bot_user(&self, bot: usize) -> Value {
        let bot = &self.bots[bot];
        json!({ "id": bot.id, "is_bot": true, "first_name": bot.username, "username": bot.username })
    }

    fn set_my_commands(&mut self, bot: usize, params: &Map<String, Value>) -> Result<Value, Reply> {
        let commands = param_json(params, "commands")
            .ok_or_else(|| Reply::bad_request("parameter \"commands\" is required"))?;
        // The whole call in the fake's own type: a field Telegram does not know fails.
        let mut body = params.clone();
        body.insert("commands".into(), commands);
        for name in ["scope"] {
            if let Some(value) = param_json(params, name) {
                body.insert(name.into(), value);
            }
        }
        let SetMyCommands { commands, scope, language_code } =
            serde_json::from_value(Value::Object(body))
                .map_err(|_| Reply::bad_request("can't parse commands JSON object"))?;
        if scope.is_some_and(|scope| scope.get("type").and_then(Value::as_str).is_none()) {
            return Err(Reply::bad_request("can't parse BotCommandScope JSON object"));
        }
        if language_code.is_some_and(|code| code.len() != 2) {
            return Err(Reply::bad_request("invalid language code specified"));
        }
        if commands.len() > 100 {
            return Err(Reply::bad_request("too many commands"));
        }
        for command in &commands {
            let name_ok = (1..=32).contains(&command.command.len())
                && command
                    .command
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !name_ok {
                return Err(Reply::bad_request("BOT_COMMAND_INVALID"));
            }
            if command.description.trim().is_empty() || command.description.chars().count() > 256 {
                return Err(Reply::bad_request("BOT_COMMAND_DESCRIPTION_INVALID"));
            }
        }
        self.bots[bot].commands = commands;
        Ok(json!(true))
    }

    fn send_message(&mut self, bot: usize, params: &Map<String, Value>) -> Result<Value, Reply> {
        let chat_id = self.resolve_chat(params)?;
        let (text, entities) = formatted_text(params)?;
        let thread = param_i64(params, "message_thread_id");
        let reply_parameters = param_json(params, "reply_parameters");
        let reply_to = reply_parameters
            .as_ref()
            .and_then(|p| p.get("message_id"))
            .and_then(json_i64)
            .or_else(|| param_i64(params, "reply_to_message_id"));
        let allow_without_reply = reply_parameters
            .as_ref()
            .and_then(|p| p.get("allow_sending_without_reply"))
            .is_some_and(json_bool)
            || param_bool(params, "allow_sending_without_reply");
        let Some(chat) = self.chats.get(&chat_id) else {
            return Err(Reply::bad_request("chat not found"));
        };
        if let Some(thread) = thread {
            let known = match chat.kind {
                ChatKind::Supergroup if chat.is_forum => {
                    thread != 1 && chat.topics.contains(&thread)
                }
                ChatKind::Supergroup => true,
                ChatKind::Private | ChatKind::Group | ChatKind::Channel => false,
            };
            if !known {
                return Err(Reply::bad_request("message thread not found"));
            }
        }
        let replied = match reply_to.map(|id| (id, chat.messages.get(&id))) {
            Some((id, Some(target))) => Some((id, embedded(&target.json))),
            Some((_, None)) if !allow_without_reply => {
                return Err(Reply::bad_request("message to be replied not found"));
            }
            _ => None,
        };
        let is_forum = chat.is_forum;

        self.admit(bot, "sendMessage", chat_id)?;

        let from = self.bot_user(bot);
        let bot_id = self.bots[bot].id;
        let now = self.now();
        let Some(chat) = self.chats.get_mut(&chat_id) else {
            return Err(Reply::bad_request("chat not found"));
        };
        let message_id = chat.take_message_id();
        let mut message = json!({
            "message_id": message_id,
            "from": from,
            "chat": chat.json(),
            "date": unix_now(),
            "text": text,
        });
        if !entities.is_empty() {
            message["entities"] = json!(entities);
        }
        if let Some(thread) = thread {
            message["message_thread_id"] = json!(thread);
            if is_forum {
                message["is_topic_message"] = json!(true);
            }
        }
        if let Some((_, replied)) = &replied {
            message["reply_to_message"] = replied.clone();
        }
        let record = BotMessage {
            bot_id,
            chat_id,
            message_id,
            text: text.clone(),
            entities,
            versions: vec![text],
            edits: 0,
            reply_to: replied.map(|(id, _)| id),
            message_thread_id: thread,
            sent_at: now,
            edited_at: None,
        };
        chat.messages
            .insert(message_id, StoredMessage { json: message.clone(), bot: Some(record) });
        self.count(bot, chat_id);
        Ok(message)
    }

    /// `sendPhoto` / `sendDocument` with the file uploaded under `field`.
    fn send_file(
        &mut self,
        bot: usize,
        method: &'static str,
        field: &str,
        params: &Map<String, Value>,
        upload: Option<Upload>,
    ) -> Result<Value, Reply> {
        let chat_id = self.resolve_chat(params)?;
        let upload = upload
            .filter(|upload| upload.field == field)
            .ok_or_else(|| Reply::bad_request(format!("there is no {field} in the request")))?;
        if upload.content.is_empty() {
            return Err(Reply::bad_request("file must be non-empty"));
        }
        let caption = params.get("caption").and_then(Value::as_str).map(str::to_owned);
        if caption.as_ref().is_some_and(|c| c.chars().count() > 1024) {
            return Err(Reply::bad_request("message caption is too long"));
        }
        let thread = param_i64(params, "message_thread_id");
        if !self.chats.contains_key(&chat_id) {
            return Err(Reply::bad_request("chat not found"));
        }
        self.admit(bot, method, chat_id)?;
        let from = self.bot_user(bot);
        let bot_id = self.bots[bot].id;
        let Some(chat) = self.chats.get_mut(&chat_id) else {
            return Err(Reply::bad_request("chat not found"));
        };
        let message_id = chat.take_message_id();
        let mut message = json!({
            "message_id": message_id,
            "from": from,
            "chat": chat.json(),
            "date": unix_now(),
        });
        if let Some(caption) = &caption {
            message["caption"] = json!(caption);
        }
        if let Some(thread) = thread {
            message["message_thread_id"] = json!(thread);
        }
        chat.messages.insert(message_id, StoredMessage { json: message.clone(), bot: None });
        self.files.push(BotFile {
            bot_id,
            chat_id,
            message_id,
            method,
            filename: upload.filename,
            content_type: upload.content_type,
            caption,
            message_thread_id: thread,
            content: upload.content,
        });
        self.count(bot, chat_id);
        Ok(message)
    }

    fn edit_message_text(
        &mut self,
        bot: usize,
        params: &Map<String, Value>,
    ) -> Result<Value, Reply> {
        let chat_id = self.resolve_chat(params)?;
        let message_id = param_i64(params, "message_id")
            .ok_or_else(|| Reply::bad_request("message identifier is not specified"))?;
        let (text, entities) = formatted_text(params)?;
        let bot_id = self.bots[bot].id;
        let stored = self
            .chats
            .get(&chat_id)
            .and_then(|chat| chat.messages.get(&message_id))
            .ok_or_else(|| Reply::bad_request("message to edit not found"))?;
        match &stored.bot {
            Some(record) if record.bot_id == bot_id => {
                if record.text == text && record.entities == entities {
                    return Err(Reply::bad_request(NOT_MODIFIED));
                }
            }
            _ => return Err(Reply::bad_request("message can't be edited")),
        }

        self.admit(bot, "editMessageText", chat_id)?;

        let now = self.now();
        let stored = self
            .chats
            .get_mut(&chat_id)
            .and_then(|chat| chat.messages.get_mut(&message_id))
            .ok_or_else(|| Reply::bad_request("message to edit not found"))?;
        stored.json["text"] = json!(text);
        if entities.is_empty() {
            if let Some(message) = stored.json.as_object_mut() {
                message.remove("entities");
            }
        } else {
            stored.json["entities"] = json!(entities);
        }
        stored.json["edit_date"] = json!(unix_now());
        if let Some(record) = &mut stored.bot {
            record.text.clone_from(&text);
            record.entities = entities;
            record.versions.push(text);
            record.edits += 1;
            record.edited_at = Some(now);
        }
        let answer = stored.json.clone();
        self.count(bot, chat_id);
        Ok(answer)
    }

    /// The chat `chat_id` names: a known id, or `@username` of a known chat.
    fn resolve_chat(&self, params: &Map<String, Value>) -> Result<i64, Reply> {
        let id = match params.get("chat_id") {
            Some(Value::String(name)) if name.starts_with('@') => self
                .chats
                .values()
                .find(|chat| chat.username.as_deref() == Some(&name[1..]))
                .map(|chat| chat.id),
            Some(value) => json_i64(value),
            None => return Err(Reply::bad_request("chat_id is empty")),
        };
        id.filter(|id| self.chats.contains_key(id))
            .ok_or_else(|| Reply::bad_request("chat not found"))
    }

    /// Checks a message call against the flood limits, recording a violation.
    fn admit(&mut self, bot: usize, method: &str, chat_id: i64) -> Result<(), Reply> {
        if self.limits.enforcement == Enforcement::Off {
            return Ok(());
        }
        let now = self.now();
        let Some((kind, wait)) = self.bots[bot].limiter.check(&self.limits, chat_id, now) else {
            return Ok(());
        };
        self.violations.push(Violation {
            bot_id: self.bots[bot].id,
            method: method.to_owned(),
            chat_id,
            kind,
            at: now,
        });
        match self.limits.enforcement {
            Enforcement::Reject => Err(Reply::retry_after(retry_after_secs(wait))),
            Enforcement::RecordOnly | Enforcement::Off => Ok(()),
        }
    }

    /// Counts an accepted message call toward the flood limits.
    fn count(&mut self, bot: usize, chat_id: i64) {
        if self.limits.enforcement != Enforcement::Off {
            let now = self.now();
            self.bots[bot].limiter.record(chat_id, now);
        }
    }

    // ---- getUpdates ----

    /// Starts a poll: applies a queued fault, the sticky `allowed_updates` and
    /// the `offset`, and supersedes any earlier poll of this bot.
    pub(super) fn begin_poll(
        &mut self,
        bot: usize,
        call: usize,
        params: &Map<String, Value>,
    ) -> Result<Poll, Reply> {
        let bot_state = &mut self.bots[bot];
        if let Some(fault) = bot_state.faults.get_mut("getupdates").and_then(VecDeque::pop_front) {
            let reply = fault.reply();
            self.finish_call(call, reply.status());
            return Err(reply);
        }
        if let Some(Value::Array(kinds)) = param_json(params, "allowed_updates") {
            bot_state.allowed_updates =
                kinds.iter().filter_map(Value::as_str).map(str::to_owned).collect();
        }
        let allowed = &bot_state.allowed_updates;
        if !allowed.is_empty() {
            bot_state.updates.retain(|(_, update)| {
                update_kind(update).is_some_and(|kind| allowed.iter().any(|k| k == kind))
            });
        }
        match param_i64(params, "offset") {
            Some(offset) if offset > 0 => {
                bot_state.updates.retain(|(id, _)| *id >= offset);
                bot_state.confirmed_offset = bot_state.confirmed_offset.max(offset);
            }
            Some(offset) if offset < 0 => {
                // A negative offset keeps the last -offset updates and forgets the rest.
                let keep = usize::try_from(offset.unsigned_abs()).unwrap_or(usize::MAX);
                let forget = bot_state.updates.len().saturating_sub(keep);
                bot_state.updates.drain(..forget);
                let first_kept =
                    bot_state.updates.front().map_or(bot_state.next_update_id, |(id, _)| *id);
                bot_state.confirmed_offset = bot_state.confirmed_offset.max(first_kept);
            }
            _ => {}
        }
        bot_state.poll_generation += 1;
        bot_state.waiting_polls += 1;
        let limit = param_i64(params, "limit").unwrap_or(100).clamp(1, 100);
        Ok(Poll {
            generation: bot_state.poll_generation,
            limit: usize::try_from(limit).unwrap_or(100),
        })
    }

    /// The answer to `poll` if it has one now: 409 when superseded, the pending
    /// updates when there are any, or (with `now`) an empty list.
    pub(super) fn poll_answer(&self, bot: usize, poll: &Poll, now: bool) -> Option<Reply> {
        let bot = &self.bots[bot];
        if bot.poll_generation != poll.generation {
            return Some(Reply::error(409, CONFLICT));
        }
        if bot.updates.is_empty() && !now {
            return None;
        }
        let updates = bot.updates.iter().take(poll.limit).map(|(_, u)| u.clone()).collect();
        Some(Reply::Ok(Value::Array(updates)))
    }

    pub(super) fn end_poll(&mut self, bot: usize) {
        let bot = &mut self.bots[bot];
        bot.waiting_polls = bot.waiting_polls.saturating_sub(1);
    }
}

impl ChatState {
    fn take_message_id(&mut self) -> i64 {
        let id = self.next_message_id;
        self.next_message_id += 1;
        id
    }

    /// The chat as messages show it.
    fn json(&self) -> Value {
        let mut chat = json!({ "id": self.id, "type": self.kind.as_str() });
        match self.kind {
            ChatKind::Private => chat["first_name"] = json!(format!("User {}", self.id)),
            ChatKind::Group | ChatKind::Supergroup | ChatKind::Channel => {
                chat["title"] =
                    json!(self.title.clone().unwrap_or_else(|| format!("Chat {}", self.id)));
            }
        }
        if let Some(username) = &self.username {
            chat["username"] = json!(username);
        }
        if self.is_forum {
            chat["is_forum"] = json!(true);
        }
        chat
    }
}

/// A user as messages show it.
fn user_json(id: i64) -> Value {
    json!({ "id": id, "is_bot": false, "first_name": format!("User {id}"), "username": format!("user{id}"), "language_code": "en" })
}

/// A message as embedded in a reply: Telegram does not nest replies further.
fn embedded(message: &Value) -> Value {
    let mut message = message.clone();
    if let Some(fields) = message.as_object_mut() {
        fields.remove("reply_to_message");
    }
    message
}

/// The `bot_command` entity Telegram adds to a text starting with `/command`.
fn command_entity(text: &str) -> Option<Value> {
    let command =
        text.split(char::is_whitespace).next().filter(|c| c.len() > 1 && c.starts_with('/'))?;
    Some(json!({ "type": "bot_command", "offset": 0, "length": command.encode_utf16().count() }))
}

/// `update`'s kind: its one field besides `update_id`.
fn update_kind(update: &Value) -> Option<&str> {
    update.as_object()?.keys().map(String::as_str).find(|key| *key != "update_id")
}

/// The text and entities of a `sendMessage` or `editMessageText`, checked as
/// Telegram checks them: not blank, at most 4096 UTF-16 code units, entities
/// inside the text.
fn formatted_text(params: &Map<String, Value>) -> Result<(String, Vec<Entity>), Reply> {
    let text = match params.get("text") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Number(number)) => number.to_string(),
        _ => String::new(),
    };
    if text.trim().is_empty() {
        return Err(Reply::bad_request("message text is empty"));
    }
    let length = text.encode_utf16().count();
    if length > MAX_TEXT_UTF16 {
        return Err(Reply::bad_request("message is too long"));
    }
    let entities: Vec<Entity> = match param_json(params, "entities") {
        None => Vec::new(),
        Some(entities) => serde_json::from_value(entities)
            .map_err(|e| Reply::bad_request(format!("can't parse entities: {e}")))?,
    };
    for entity in &entities {
        if !ENTITY_TYPES.contains(&entity.kind.as_str()) {
            return Err(Reply::bad_request(format!(
                "can't parse entities: unsupported entity type \"{}\"",
                entity.kind
            )));
        }
        let end = entity.offset.checked_add(entity.length);
        if end.is_none_or(|end| end > length) {
            return Err(Reply::bad_request(format!(
                "can't parse entities: the {} entity at offset {} with length {} ends beyond the text's {length} UTF-16 code units",
                entity.kind, entity.offset, entity.length
            )));
        }
    }
    Ok((text, entities))
}

/// An integer parameter, given as a number or (form, query) as a string.
pub(super) fn param_i64(params: &Map<String, Value>, name: &str) -> Option<i64> {
    params.get(name).and_then(json_i64)
}

fn json_i64(value: &Value) -> Option<i64> {
    match value {
        Value::Number(number) => number.as_i64(),
        Value::String(text) => text.trim().parse().ok(),
        _ => None,
    }
}

fn param_bool(params: &Map<String, Value>, name: &str) -> bool {
    params.get(name).is_some_and(json_bool)
}

fn json_bool(value: &Value) -> bool {
    match value {
        Value::Bool(flag) => *flag,
        Value::String(text) => matches!(text.as_str(), "true" | "True" | "1"),
        _ => false,
    }
}

/// An object or array parameter, given as JSON or (form, query) as a string of
/// JSON.
fn param_json(params: &Map<String, Value>, name: &str) -> Option<Value> {
    match params.get(name)? {
        Value::Null => None,
        Value::String(text) => Some(serde_json::from_str(text).unwrap_or_else(|_| json!(text))),
        value => Some(value.clone()),
    }
}

/// Seconds since the Unix epoch, for `date` fields.
fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| i64::try_from(since.as_secs()).unwrap_or(i64::MAX))
}
