//! One native run: the loop of model turns and tool calls, steering, compaction,
//! the budget check and the run's one `Completed`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use lemon_core::approvals::{ApprovalRequest, Outcome, PendingApproval};
use lemon_core::budget::{BudgetGuard, BudgetScope, TokenUsage};
use lemon_core::config::ApprovalAction;
use lemon_core::engine::{
    Action, ActionKind, ActionPhase, Completion, EngineEvent, EventSink, ResumeToken, RunError,
    StartRequest,
};
use lemon_core::tool::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::compact;
use super::images;
use super::session::Sessions;
use super::settings::NativeSettings;
use super::{Control, ENGINE_ID};
use crate::cli::ApiKey;
use crate::llm::{ChatMessage, LlmClient, LlmError, LlmEvent, LlmRequest, ToolCall};

/// What a run is built from.
#[derive(Debug)]
pub(crate) struct AgentParts {
    pub(crate) req: StartRequest,
    pub(crate) settings: Arc<NativeSettings>,
    pub(crate) client: Arc<dyn LlmClient>,
    pub(crate) api_key: Option<ApiKey>,
    /// The run's tools with their specs.
    pub(crate) tools: Arc<ToolSet>,
    pub(crate) budget: Option<Arc<dyn BudgetGuard>>,
    pub(crate) sessions: Sessions,
    pub(crate) session_id: String,
    pub(crate) history: Vec<ChatMessage>,
    pub(crate) sink: EventSink,
    pub(crate) cancel: CancellationToken,
    pub(crate) controls: mpsc::Receiver<Control>,
    pub(crate) workspace: Option<PathBuf>,
    pub(crate) approvals: Option<super::Approvals>,
}

/// The tools of a run, ready for its model requests: made once per set of
/// tools offered and shared by every run offered the same ones.
#[derive(Debug)]
pub(crate) struct ToolSet {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    /// Sorted by name, as every request lists them.
    specs: Arc<[ToolSpec]>,
    /// The specs' share of every request's token estimate.
    tool_tokens: u64,
}

impl ToolSet {
    pub(crate) fn new(tools: Vec<(ToolSpec, Arc<dyn Tool>)>) -> Self {
        let mut by_name = BTreeMap::new();
        let mut specs = Vec::with_capacity(tools.len());
        for (spec, tool) in tools {
            by_name.insert(spec.name.clone(), tool);
            specs.push(spec);
        }
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        let tool_tokens = compact::tool_tokens(&specs);
        ToolSet { tools: by_name, specs: specs.into(), tool_tokens }
    }
}

/// Why a run ends early.
#[derive(Debug)]
enum Halt {
    /// Cancelled, or nobody listens any more: nothing more is sent.
    Stop,
    /// The run fails with this error.
    Fail(RunError),
}

/// How one streamed model turn ended.
#[derive(Debug)]
enum Turn {
    Done {
        text: String,
        calls: Vec<ToolCall>,
    },
    /// A redirect dropped the turn; its instruction comes next.
    Redirected(String),
    /// The turn failed; `streamed`: after text or reasoning went out.
    Failed {
        error: LlmError,
        streamed: bool,
    },
}

/// One run of the native engine.
#[derive(Debug)]
pub(crate) struct Agent {
    req: StartRequest,
    settings: Arc<NativeSettings>,
    client: Arc<dyn LlmClient>,
    api_key: Option<ApiKey>,
    tools: Arc<ToolSet>,
    budget: Option<Arc<dyn BudgetGuard>>,
    sessions: Sessions,
    session_id: String,
    messages: Vec<ChatMessage>,
    sink: EventSink,
    cancel: CancellationToken,
    controls: mpsc::Receiver<Control>,
    controls_open: bool,
    /// Steers (and redirects between turns) waiting for the next turn boundary.
    pending: Vec<String>,
    workspace: Option<PathBuf>,
    usage: TokenUsage,
    /// The tool calls running now, so a stop can wait for them.
    tool_tasks: TaskTracker,
    compactions: u32,
    model: String,
    approvals: Option<super::Approvals>,
    /// Where the run's untrusted text came from: its prompt's (the mark set
    /// where it entered), or a page `fetch` brought in. Its calls are judged
    /// by the untrusted rules from then on.
    untrusted: Option<String>,
}

impl Agent {
    pub(crate) fn new(parts: AgentParts) -> Self {
        let model = parts
            .req
            .model
            .clone()
            .map(|m| m.trim().to_owned())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| parts.settings.model.clone());
        let untrusted = lemon_core::untrusted::source(&parts.req.meta);
        Agent {
            req: parts.req,
            settings: parts.settings,
            client: parts.client,
            api_key: parts.api_key,
            tools: parts.tools,
            budget: parts.budget,
            sessions: parts.sessions,
            session_id: parts.session_id,
            messages: parts.history,
            sink: parts.sink,
            cancel: parts.cancel,
            controls: parts.controls,
            controls_open: true,
            pending: Vec::new(),
            workspace: parts.workspace,
            usage: TokenUsage::default(),
            tool_tasks: TaskTracker::new(),
            compactions: 0,
            model,
            approvals: parts.approvals,
            untrusted,
        }
    }

    fn resume(&self) -> ResumeToken {
        ResumeToken::new(ENGINE_ID, self.session_id.clone())
    }

    fn usage_json(&self) -> Value {
        json!({ "input_tokens": self.usage.input_tokens, "output_tokens": self.usage.output_tokens })
    }

    /// Runs to the end: one `Completed`, or nothing after a cancel. Returns once
    /// every tool task has ended.
    pub(crate) async fn run(mut self) {
        let outcome = self.drive().await;
        self.tool_tasks.close();
        self.tool_tasks.wait().await;
        let completion = match outcome {
            Ok(completion) => completion,
            Err(Halt::Stop) => {
                tracing::info!(run_id = %self.req.run_id, engine = ENGINE_ID, "native run stopped");
                return;
            }
            Err(Halt::Fail(error)) => {
                let mut completion = Completion::failure(error, Some(self.resume()));
                completion.usage = self.usage_json();
                completion
            }
        };
        let _ = self.send(EngineEvent::Completed(completion)).await;
    }

    async fn send(&self, event: EngineEvent) -> Result<(), Halt> {
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => Err(Halt::Stop),
            sent = self.sink.send(event) => sent.map_err(|_| Halt::Stop),
        }
    }

    async fn save(&self) {
        self.sessions.save(&self.session_id, &self.messages).await;
    }

    async fn drive(&mut self) -> Result<Completion, Halt> {
        let meta = json!({ "cwd": self.req.cwd.display().to_string(), "model": self.model });
        self.send(EngineEvent::Started {
            resume: Some(self.resume()),
            title: Some("Lemon".to_owned()),
            meta,
        })
        .await?;
        let prompt = lemon_core::untrusted::prompt_for_model(&self.req.prompt, &self.req.meta);
        let images = if self.settings.vision {
            images::from_attachments(&self.req.attachments, &self.req.off_limits).await
        } else {
            Vec::new()
        };
        if !images.is_empty() {
            tracing::info!(run_id = %self.req.run_id, images = images.len(), "images shown to the model");
        }
        self.messages.push(ChatMessage::User { text: prompt.into_owned(), images });
        images::keep_newest(&mut self.messages);
        self.save().await;
        let mut turns = 0u32;
        let mut overflow_compacted = false;
        loop {
            self.take_controls();
            for text in std::mem::take(&mut self.pending) {
                self.messages.push(ChatMessage::user(text));
            }
            if turns >= self.settings.max_turns {
                let n = self.settings.max_turns;
                return Err(Halt::Fail(RunError::Engine {
                    message: format!(
                        "the turn limit was hit: stopped after {n} model turns (max_turns = {n} in [gateway.engines.lemon])"
                    ),
                }));
            }
            self.check_budget().await?;
            self.fit(false).await?;
            turns += 1;
            let request = self.request();
            match self.stream_turn(request).await? {
                Turn::Done { text, calls } => {
                    overflow_compacted = false;
                    self.messages.push(ChatMessage::Assistant {
                        text: text.clone(),
                        tool_calls: calls.clone(),
                    });
                    if calls.is_empty() {
                        self.save().await;
                        self.take_controls();
                        if self.pending.is_empty() {
                            let mut completion = Completion::success(text, Some(self.resume()));
                            completion.usage = self.usage_json();
                            return Ok(completion);
                        }
                        continue;
                    }
                    let redirect = self.run_tools(calls).await?;
                    self.save().await;
                    self.pending.extend(redirect);
                }
                Turn::Redirected(text) => self.pending.push(text),
                Turn::Failed { error, streamed: false } if self.drop_refused_images(&error) => {
                    turns -= 1;
                    self.save().await;
                }
                Turn::Failed { error: LlmError::ContextOverflow { message }, .. } => {
                    if overflow_compacted {
                        return Err(Halt::Fail(RunError::ContextOverflow {
                            message: self.redact(&format!("context overflow: {message}")),
                        }));
                    }
                    overflow_compacted = true;
                    turns -= 1;
                    self.fit(true).await?;
                }
                Turn::Failed { error, .. } => return Err(Halt::Fail(self.llm_failure(&error))),
            }
        }
    }

    fn request(&self) -> LlmRequest {
        LlmRequest {
            model: self.model.clone(),
            system: self.settings.system_prompt.clone(),
            messages: self.messages.clone(),
            tools: self.tools.specs.clone(),
            max_tokens: self.settings.max_tokens,
            temperature: self.settings.temperature,
        }
    }

    /// After a refusal of a request with images (a server or model that
    /// cannot see, images it finds too large) that streamed nothing yet,
    /// drops every image of the conversation so the turn can be tried again
    /// without them: the text still names each file's path. Whether there
    /// were images to drop.
    fn drop_refused_images(&mut self, error: &LlmError) -> bool {
        let refusal = matches!(
            error,
            LlmError::Invalid { .. } | LlmError::Server { .. } | LlmError::ContextOverflow { .. }
        );
        if !refusal || !images::drop_all(&mut self.messages) {
            return false;
        }
        tracing::warn!(
            run_id = %self.req.run_id,
            provider = %self.settings.provider,
            error = %self.redact(&error.to_string()),
            "the provider refused a request with images; trying the turn again without them"
        );
        true
    }

    /// Takes every control waiting, without waiting: between turns a redirect
    /// has no turn to drop and reads as a steer.
    fn take_controls(&mut self) {
        while self.controls_open {
            match self.controls.try_recv() {
                Ok(control) => {
                    if let Some(text) = self.accept(control) {
                        self.pending.push(text);
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => self.controls_open = false,
            }
        }
    }

    /// Queues a steer; `Some(text)` for a redirect.
    fn accept(&mut self, control: Control) -> Option<String> {
        match control {
            Control::Steer(text, reply) => {
                tracing::info!(run_id = %self.req.run_id, "native run steered");
                self.pending.push(text);
                let _ = reply.send(Ok(()));
                None
            }
            Control::Redirect(text, reply) => {
                tracing::info!(run_id = %self.req.run_id, "native run redirected");
                let _ = reply.send(Ok(()));
                Some(text)
            }
        }
    }

    async fn next_control(controls: &mut mpsc::Receiver<Control>, open: bool) -> Option<Control> {
        if open {
            controls.recv().await
        } else {
            std::future::pending().await
        }
    }

    async fn check_budget(&self) -> Result<(), Halt> {
        let Some(budget) = &self.budget else { return Ok(()) };
        let scope = BudgetScope {
            run_id: &self.req.run_id,
            session_key: &self.req.session_key,
            engine: ENGINE_ID,
            model: &self.model,
        };
        budget.check(scope, self.usage).await.map_err(|exceeded| {
            Halt::Fail(RunError::BudgetExceeded {
                detail: format!(
                    "the {} limit of {} was reached ({} spent)",
                    exceeded.limit, exceeded.allowed, exceeded.spent
                ),
            })
        })
    }

    /// `text` with the API key, should a provider echo it, taken out.
    fn redact(&self, text: &str) -> String {
        match &self.api_key {
            Some(key) if !key.expose().is_empty() => text.replace(key.expose(), "[REDACTED]"),
            _ => text.to_owned(),
        }
    }

    fn llm_failure(&self, error: &LlmError) -> RunError {
        let secret = &self.settings.api_key_secret;
        let message = match error {
            LlmError::Auth { .. } => format!(
                "the {} API refused the key in `{secret}`: store a valid key as `{secret}` in secrets.toml or the {} environment variable",
                self.settings.provider,
                lemon_core::secrets::env_var_name(secret),
            ),
            LlmError::ContextOverflow { message } => {
                return RunError::ContextOverflow {
                    message: self.redact(&format!("context overflow: {message}")),
                }
            }
            other => format!("the {} request failed: {other}", self.settings.provider),
        };
        RunError::Engine { message: self.redact(&message) }
    }

    /// Streams one model turn: text as deltas, reasoning as an action.
    async fn stream_turn(&mut self, request: LlmRequest) -> Result<Turn, Halt> {
        let started = tokio::select! {
            biased;
            () = self.cancel.cancelled() => return Err(Halt::Stop),
            started = self.client.stream(request) => started,
        };
        let mut stream = match started {
            Ok(stream) => stream,
            Err(error) => return Ok(Turn::Failed { error, streamed: false }),
        };
        let mut text = String::new();
        let mut calls = Vec::new();
        let mut reasoning: Option<(String, String)> = None;
        loop {
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(Halt::Stop),
                control = Self::next_control(&mut self.controls, self.controls_open) => match control {
                    Some(control) => {
                        if let Some(redirect) = self.accept(control) {
                            // Dropping the stream stops the model turn.
                            return Ok(Turn::Redirected(redirect));
                        }
                    }
                    None => self.controls_open = false,
                },
                event = stream.next() => match event {
                    Some(Ok(LlmEvent::TextDelta(delta))) => {
                        if !delta.is_empty() {
                            text.push_str(&delta);
                            self.send(EngineEvent::Delta(delta)).await?;
                        }
                    }
                    Some(Ok(LlmEvent::ReasoningDelta(delta))) => match &mut reasoning {
                        Some((_, so_far)) => so_far.push_str(&delta),
                        None => {
                            let id = format!("lemon.reasoning.{}", self.messages.len());
                            self.send(EngineEvent::Action(action(&id, ActionKind::Reasoning, "reasoning", ActionPhase::Started))).await?;
                            reasoning = Some((id, delta));
                        }
                    },
                    Some(Ok(LlmEvent::ToolCall(call))) => calls.push(call),
                    Some(Ok(LlmEvent::Usage(usage))) => {
                        self.usage.input_tokens += usage.input_tokens;
                        self.usage.output_tokens += usage.output_tokens;
                    }
                    Some(Ok(LlmEvent::Done(_))) | None => break,
                    Some(Err(error)) => {
                        let streamed = !text.is_empty() || reasoning.is_some();
                        return Ok(Turn::Failed { error, streamed });
                    }
                },
            }
        }
        if let Some((id, thought)) = reasoning {
            let mut done = action(&id, ActionKind::Reasoning, "reasoning", ActionPhase::Completed);
            done.ok = Some(true);
            done.message = Some(lemon_core::tool::preview(&thought));
            done.detail = json!({ "source": "lemon_reasoning" });
            self.send(EngineEvent::Action(done)).await?;
        }
        Ok(Turn::Done { text, calls })
    }

    /// Runs the turn's tool calls at once and appends their results in call
    /// order. Returns a redirect's instruction when one came in meanwhile.
    ///
    /// Each call is first judged by the owner's policy: a denied call is not
    /// run; an asked one waits (beside the others) for its answer, then runs
    /// or is reported denied or expired to the model.
    async fn run_tools(&mut self, calls: Vec<ToolCall>) -> Result<Option<String>, Halt> {
        let turn_cancel = self.cancel.child_token();
        let mut results: Vec<Option<ToolOutput>> = vec![None; calls.len()];
        let mut running: FuturesUnordered<StepFuture> = FuturesUnordered::new();
        let mut asked: BTreeMap<usize, (Arc<dyn Tool>, Value, PendingApproval)> = BTreeMap::new();
        for (index, call) in calls.iter().enumerate() {
            let args = parse_arguments(&call.arguments);
            let (kind, title) = classify(call, &self.req.cwd);
            let mut started = action(&action_id(call), kind, &title, ActionPhase::Started);
            started.detail = json!({
                "name": call.name,
                "args": args.as_ref().cloned().unwrap_or_else(|_| Value::String(call.arguments.clone())),
            });
            self.send(EngineEvent::Action(started)).await?;
            let tool = self.tools.tools.get(&call.name).cloned();
            match (tool, args) {
                (None, _) => {
                    results[index] = Some(ToolOutput::error(format!(
                        "unknown tool {:?}: the tools are {}",
                        call.name,
                        self.tools
                            .specs
                            .iter()
                            .map(|s| s.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                (Some(_), Err(why)) => {
                    results[index] = Some(ToolOutput::error(format!(
                        "the arguments of {} are not a JSON object: {why}",
                        call.name
                    )));
                }
                (Some(tool), Ok(args)) => match self.judge(call, &args) {
                    Judged::Allowed => {
                        running.push(self.start_tool(index, call, tool, args, &turn_cancel))
                    }
                    Judged::Denied(output) => results[index] = Some(output),
                    Judged::Asked(waiting) => {
                        let request = waiting.request.clone();
                        let started = lemon_core::approvals::asked_action(
                            &approval_id(call),
                            &approval_title(call),
                            &request,
                        );
                        self.send(EngineEvent::Action(started)).await?;
                        asked.insert(index, (tool, args, request));
                        let cancel = turn_cancel.clone();
                        running.push(Box::pin(async move {
                            tokio::select! {
                                outcome = waiting.outcome() => Step::Answered(index, Some(outcome)),
                                () = cancel.cancelled() => Step::Answered(index, None),
                            }
                        }));
                    }
                },
            }
        }
        // Calls that could not run complete at once.
        for (index, call) in calls.iter().enumerate() {
            if let Some(output) = &results[index] {
                self.send(EngineEvent::Action(completed_action(call, output, &self.req.cwd)))
                    .await?;
            }
        }
        let mut redirect = None;
        while !running.is_empty() {
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(Halt::Stop),
                control = Self::next_control(&mut self.controls, self.controls_open) => match control {
                    Some(control) => {
                        if let Some(text) = self.accept(control) {
                            turn_cancel.cancel();
                            redirect = Some(text);
                        }
                    }
                    None => self.controls_open = false,
                },
                Some(step) = running.next() => match step {
                    Step::Finished(index, joined) => {
                        let output = joined.unwrap_or_else(|_| ToolOutput::error("the tool failed unexpectedly"));
                        self.send(EngineEvent::Action(completed_action(&calls[index], &output, &self.req.cwd))).await?;
                        results[index] = Some(self.outside_text(&calls[index], output));
                    }
                    Step::Answered(index, outcome) => {
                        let call = &calls[index];
                        let Some((tool, args, request)) = asked.remove(&index) else { continue };
                        let (done, refusal) = self.answered(call, &request, outcome.as_ref());
                        self.send(EngineEvent::Action(done)).await?;
                        match refusal {
                            None => running.push(self.start_tool(index, call, tool, args, &turn_cancel)),
                            Some(output) => {
                                self.send(EngineEvent::Action(completed_action(call, &output, &self.req.cwd))).await?;
                                results[index] = Some(output);
                            }
                        }
                    }
                }
            }
        }
        for (call, output) in calls.iter().zip(results) {
            let output = output.unwrap_or_else(|| ToolOutput::error("cancelled"));
            self.messages.push(ChatMessage::ToolResult {
                call_id: call.id.clone(),
                name: call.name.clone(),
                content: output.text,
                is_error: output.is_error,
            });
        }
        Ok(redirect)
    }

    /// What the owner's policy says about `call`: allowed, denied (with what
    /// the model is told), or asked (put up in the hub).
    fn judge(&self, call: &ToolCall, args: &Value) -> Judged {
        let Some(approvals) = &self.approvals else { return Judged::Allowed };
        let policy = approvals.rules.for_scope(&lemon_core::approvals::RunScope {
            untrusted: self.untrusted.is_some(),
            engine: "lemon",
            cwd: &self.req.cwd,
            meta: &self.req.meta,
        });
        if policy.is_empty() {
            return Judged::Allowed;
        }
        let subject = lemon_core::approvals::subject(&call.name, args, &self.req.cwd);
        let verdict = policy.judge(&call.name, &subject);
        match verdict.action {
            ApprovalAction::Allow => Judged::Allowed,
            ApprovalAction::Deny => {
                tracing::info!(
                    run_id = %self.req.run_id,
                    tool = %call.name,
                    rule = %verdict.rule_text,
                    "tool call denied by the approval policy"
                );
                Judged::Denied(ToolOutput::error(format!(
                    "The owner's policy denies this call ({}); it was not run.",
                    verdict.rule_text
                )))
            }
            ApprovalAction::Ask => {
                let session = self.req.session_key.as_str();
                if let Some(how) = approvals.hub.granted(session, &call.name, &subject) {
                    tracing::info!(
                        run_id = %self.req.run_id,
                        tool = %call.name,
                        %how,
                        "tool call allowed by a standing yes of its session"
                    );
                    return Judged::Allowed;
                }
                Judged::Asked(approvals.hub.ask(ApprovalRequest {
                    run_id: self.req.run_id.to_string(),
                    session_key: self.req.session_key.to_string(),
                    tool: call.name.clone(),
                    subject,
                    rule: verdict.rule_text,
                    untrusted: self.untrusted.clone(),
                    timeout: policy.timeout,
                }))
            }
        }
    }

    /// A fetched page reaches the model as untrusted data, and the run's
    /// later calls are judged by the untrusted rules.
    fn outside_text(&mut self, call: &ToolCall, mut output: ToolOutput) -> ToolOutput {
        if call.name != "fetch" || output.is_error {
            return output;
        }
        let args = parse_arguments(&call.arguments).unwrap_or_default();
        let host = lemon_core::approvals::subject(&call.name, &args, &self.req.cwd);
        let source = format!("a page fetched from {host}");
        output.text = lemon_core::untrusted::data_block(&source, &output.text);
        if self.untrusted.is_none() {
            tracing::info!(run_id = %self.req.run_id, %host, "the run read a fetched page: its later calls are judged as untrusted");
            self.untrusted = Some(source);
        }
        output
    }

    /// The approval action's completion, and what the model is told when
    /// the call does not run (`None`: approved, it runs).
    fn answered(
        &self,
        call: &ToolCall,
        request: &PendingApproval,
        outcome: Option<&Outcome>,
    ) -> (Action, Option<ToolOutput>) {
        let (done, refusal) = lemon_core::approvals::settled_action(
            &approval_id(call),
            &approval_title(call),
            request,
            outcome,
        );
        tracing::info!(
            run_id = %self.req.run_id,
            tool = %call.name,
            approval = %request.id,
            decision = done.message.as_deref().unwrap_or_default(),
            "approval settled"
        );
        (done, refusal.map(ToolOutput::error))
    }

    /// Spawns `tool` on its call; its step comes when it ends.
    fn start_tool(
        &self,
        index: usize,
        call: &ToolCall,
        tool: Arc<dyn Tool>,
        args: Value,
        turn_cancel: &CancellationToken,
    ) -> StepFuture {
        let ctx = ToolContext {
            run_id: self.req.run_id.clone(),
            session_key: self.req.session_key.clone(),
            call_id: call.id.clone(),
            cwd: self.req.cwd.clone(),
            workspace: self.workspace.clone(),
            off_limits: self.req.off_limits.clone(),
            cancel: turn_cancel.child_token(),
        };
        let handle = self.tool_tasks.spawn(async move { tool.execute(args, ctx).await });
        Box::pin(async move { Step::Finished(index, handle.await) })
    }

    /// Compacts the conversation when the next request would not fit (or
    /// always, with `force`: the provider said it does not).
    async fn fit(&mut self, force: bool) -> Result<(), Halt> {
        let window = self.settings.context_window;
        let settings = self.settings.clone();
        let system = settings.system_prompt.as_deref();
        let estimate = compact::estimate_with(system, &self.messages, self.tools.tool_tokens);
        if !force && (estimate as f64) <= compact::COMPACT_AT * window as f64 {
            return Ok(());
        }
        let overflow = |message: String| Halt::Fail(RunError::ContextOverflow { message });
        let Some(cut) =
            compact::split_point(&self.messages, compact::keep_budget(window, estimate, force))
        else {
            return Err(overflow(format!(
                "context overflow: the conversation (about {estimate} tokens) does not fit the context window of {window} tokens and cannot be compacted"
            )));
        };
        self.compactions += 1;
        let id = format!("lemon.compaction.{}", self.compactions);
        self.send(EngineEvent::Action(action(
            &id,
            ActionKind::Note,
            "compaction",
            ActionPhase::Started,
        )))
        .await?;
        let max_chars = (window as f64 * 4.0 * 0.6) as usize;
        let transcript = compact::transcript(&self.messages[..cut], max_chars);
        let request = LlmRequest {
            model: self.model.clone(),
            system: Some(compact::SUMMARY_SYSTEM.to_owned()),
            messages: vec![ChatMessage::user(format!(
                "{transcript}Summarise the conversation above."
            ))],
            tools: Arc::from([]),
            max_tokens: self.settings.max_tokens,
            temperature: self.settings.temperature,
        };
        let summary = self.summarise(request).await?;
        if summary.trim().is_empty() {
            return Err(overflow(
                "context overflow: the model gave no summary to compact the conversation with"
                    .to_owned(),
            ));
        }
        let mut messages =
            vec![ChatMessage::user(format!("{}{}", compact::SUMMARY_PREFIX, summary.trim()))];
        messages.extend(self.messages.drain(cut..));
        self.messages = messages;
        self.save().await;
        let mut done = action(&id, ActionKind::Note, "compaction", ActionPhase::Completed);
        done.ok = Some(true);
        done.message = Some(format!("summarised {cut} earlier messages into one"));
        done.detail = json!({ "summarised_messages": cut, "estimated_tokens": estimate, "context_window": window });
        self.send(EngineEvent::Action(done)).await?;
        let after = compact::estimate_with(system, &self.messages, self.tools.tool_tokens);
        if after > window {
            return Err(overflow(format!(
                "context overflow: after compaction the conversation (about {after} tokens) still exceeds the context window of {window} tokens"
            )));
        }
        Ok(())
    }

    /// The text of one summary request.
    async fn summarise(&mut self, request: LlmRequest) -> Result<String, Halt> {
        let started = tokio::select! {
            biased;
            () = self.cancel.cancelled() => return Err(Halt::Stop),
            started = self.client.stream(request) => started,
        };
        let mut stream = started.map_err(|e| Halt::Fail(self.llm_failure(&e)))?;
        let mut text = String::new();
        loop {
            let event = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(Halt::Stop),
                event = stream.next() => event,
            };
            match event {
                Some(Ok(LlmEvent::TextDelta(delta))) => text.push_str(&delta),
                Some(Ok(LlmEvent::Usage(usage))) => {
                    self.usage.input_tokens += usage.input_tokens;
                    self.usage.output_tokens += usage.output_tokens;
                }
                Some(Ok(LlmEvent::Done(_))) | None => return Ok(text),
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(Halt::Fail(self.llm_failure(&error))),
            }
        }
    }
}

/// The model's arguments text as a JSON object (blank reads as `{}`).
fn parse_arguments(raw: &str) -> Result<Value, String> {
    if raw.trim().is_empty() {
        return Ok(json!({}));
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(other) => Err(format!("expected an object, got {other}")),
        Err(error) => Err(error.to_string()),
    }
}

fn action_id(call: &ToolCall) -> String {
    format!("tool_{}", call.id)
}

fn approval_id(call: &ToolCall) -> String {
    format!("approval_{}", call.id)
}

fn approval_title(call: &ToolCall) -> String {
    format!("approval: {}", call.name)
}

/// What the policy made of a call.
enum Judged {
    Allowed,
    Denied(ToolOutput),
    Asked(lemon_core::approvals::Waiting),
}

/// A tool call's progress in a turn: its approval settled (`None`: the turn
/// was cut short), or its tool ended.
enum Step {
    Answered(usize, Option<Outcome>),
    Finished(usize, Result<ToolOutput, tokio::task::JoinError>),
}

type StepFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Step> + Send>>;

/// The action kind and title of a tool call, as the vendor engines' read: the
/// command of `bash`, the path of a file tool (relative to `cwd` inside it),
/// the URL of `fetch`, the pattern of a search; cut short on a character.
fn classify(call: &ToolCall, cwd: &Path) -> (ActionKind, String) {
    let args = parse_arguments(&call.arguments).unwrap_or(Value::Null);
    crate::cli::tools::classify(&call.name, &args, &["path"], Some(cwd))
}

fn action(id: &str, kind: ActionKind, title: &str, phase: ActionPhase) -> Action {
    Action {
        id: id.to_owned(),
        kind,
        title: title.to_owned(),
        detail: Value::Null,
        phase,
        ok: None,
        message: None,
        level: None,
        result_meta: Value::Null,
    }
}

/// The `completed` action of a call ([`ToolOutput::complete`]).
fn completed_action(call: &ToolCall, output: &ToolOutput, cwd: &Path) -> Action {
    let (kind, title) = classify(call, cwd);
    let mut done = action(&action_id(call), kind, &title, ActionPhase::Completed);
    output.complete(&mut done, &call.name);
    done
}
