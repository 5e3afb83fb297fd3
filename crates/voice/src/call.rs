//! One call as an actor: it owns the call's state (what the caller said so
//! far, the answer being spoken, the marks Twilio has not played yet, the
//! timers) and ends with the call, taking its task tree with it.
//!
//! Turn taking: Deepgram's final transcripts are collected; `speech_final` or
//! `UtteranceEnd` ends the caller's turn, which is submitted to the router in
//! session `voice:<from>`. The answer's deltas are cut into sentences, each
//! spoken by ElevenLabs and sent to Twilio as `media` frames followed by a
//! `mark`. While an answer is being spoken (sent or not played yet), a final
//! transcript of at least `barge_in_min_words` words interrupts it: `clear`
//! goes to Twilio, the synthesis is dropped and the run cancelled. Voice
//! activity or noise without words interrupts nothing.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use lemon_core::bus::{EventKind, Notice};
use lemon_core::config::QueueMode;
use lemon_core::ids::{RunId, SessionKey};
use lemon_core::router::{ChannelRef, Origin, RouteError, RunFollower, RunRequest, Submitted};
use lemon_transports::refused;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::deepgram::Heard;
use crate::service::Shared;
use crate::tts::{Sentences, Speaker};
use crate::twilio;

/// Twilio plays 20 ms frames: 160 μ-law bytes at 8 kHz.
const FRAME_BYTES: usize = 160;
/// How long the goodbye may take to play before the call is hung up anyway.
const GOODBYE_WAIT: Duration = Duration::from_secs(10);

/// What the media stream's writer sends to Twilio.
#[derive(Debug)]
pub(crate) enum Out {
    Text(String),
    /// Close the stream (the call is over).
    Close,
}

/// What the media stream's reader passes on to the call.
#[derive(Debug)]
pub(crate) enum FromTwilio {
    /// A mark came back: the audio before it has played (or was cleared).
    Mark(String),
    /// The caller hung up.
    Stop,
}

/// What an answer being spoken reports to its call.
#[derive(Debug)]
enum ReplyEvent {
    Accepted { reply: u64, run_id: RunId },
    FirstDelta { reply: u64, at: Instant },
    FirstTtsByte { reply: u64, at: Instant, requested: Instant },
    FirstAudio { reply: u64, at: Instant },
    MarkSent { reply: u64, name: String },
    Done { reply: u64, answer: String },
}

/// The answer being spoken.
#[derive(Debug)]
struct Reply {
    id: u64,
    /// The call's turn it answers; `None` for the greeting and the goodbye.
    turn: Option<usize>,
    token: CancellationToken,
    run_id: Option<RunId>,
}

/// One caller turn's timings, from the moment its transcript was final.
#[derive(Debug, Clone, Default)]
struct Timings {
    speech_end: Option<Instant>,
    transcript_final: Option<Instant>,
    first_delta: Option<Instant>,
    tts_requested: Option<Instant>,
    first_tts_byte: Option<Instant>,
    first_audio: Option<Instant>,
}

fn ms_between(from: Option<Instant>, to: Option<Instant>) -> Value {
    match (from, to) {
        (Some(from), Some(to)) => {
            let ms = to.saturating_duration_since(from).as_secs_f64() * 1000.0;
            json!((ms * 100.0).round() / 100.0)
        }
        _ => Value::Null,
    }
}

impl Timings {
    /// Milliseconds of each step, and the gateway's own share (transcript final
    /// → first audio frame, without the LLM's and ElevenLabs' waits).
    fn to_json(&self) -> Value {
        let total = ms_between(self.transcript_final, self.first_audio);
        let llm = ms_between(self.transcript_final, self.first_delta);
        let tts = ms_between(self.tts_requested, self.first_tts_byte);
        let gateway = match (total.as_f64(), llm.as_f64(), tts.as_f64()) {
            (Some(total), Some(llm), Some(tts)) => {
                json!(((total - llm - tts).max(0.0) * 100.0).round() / 100.0)
            }
            _ => Value::Null,
        };
        json!({
            "speech_end_to_transcript_final_ms": ms_between(self.speech_end, self.transcript_final),
            "transcript_final_to_first_delta_ms": llm,
            "first_delta_to_first_tts_byte_ms": ms_between(self.first_delta, self.first_tts_byte),
            "tts_first_byte_ms": tts,
            "first_tts_byte_to_first_audio_ms": ms_between(self.first_tts_byte, self.first_audio),
            "transcript_final_to_first_audio_ms": total,
            "gateway_ms": gateway,
        })
    }
}

/// Why a call ended, as its record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndReason {
    CallerHungUp,
    Silence,
    MaxDuration,
    TranscriptionLost,
    Shutdown,
}

impl EndReason {
    fn as_str(self) -> &'static str {
        match self {
            EndReason::CallerHungUp => "caller_hung_up",
            EndReason::Silence => "silence",
            EndReason::MaxDuration => "max_duration",
            EndReason::TranscriptionLost => "transcription_lost",
            EndReason::Shutdown => "shutdown",
        }
    }
}

/// A call from its stream's `start` to its end.
pub(crate) struct Call {
    pub(crate) shared: Arc<Shared>,
    pub(crate) call_sid: String,
    pub(crate) from: String,
    pub(crate) stream_sid: String,
    pub(crate) out: mpsc::Sender<Out>,
    pub(crate) heard: mpsc::Receiver<Heard>,
    pub(crate) twilio: mpsc::Receiver<FromTwilio>,
    /// Cancelled when the call ends: every task of the call stops.
    pub(crate) token: CancellationToken,
}

struct State {
    session_key: SessionKey,
    /// The final transcript segments of the caller's current turn.
    utterance: Vec<String>,
    speech_end: Option<Instant>,
    reply: Option<Reply>,
    /// The turn whose answer was spoken last (until its marks come back).
    playing_turn: Option<usize>,
    next_reply: u64,
    pending_marks: HashSet<String>,
    turns: usize,
    timings: Vec<Timings>,
    /// Set once the call is ending: the goodbye is being spoken.
    ending: Option<EndReason>,
    silence_deadline: Instant,
}

impl Call {
    /// Runs the call to its end.
    pub(crate) async fn run(mut self) {
        let config = &self.shared.config;
        let started = Instant::now();
        let max_deadline = started + Duration::from_secs(config.max_call_duration_seconds);
        let silence = Duration::from_millis(config.silence_timeout_ms);
        let (events_tx, mut events) = mpsc::channel::<ReplyEvent>(64);
        let mut state = State {
            session_key: SessionKey::parse(&format!("voice:{}", self.from)).unwrap_or_else(|_| {
                SessionKey::parse("voice:unknown").unwrap_or_else(|_| unreachable!())
            }),
            utterance: Vec::new(),
            speech_end: None,
            reply: None,
            playing_turn: None,
            next_reply: 1,
            pending_marks: HashSet::new(),
            turns: 0,
            timings: Vec::new(),
            ending: None,
            silence_deadline: started + silence,
        };
        self.shared
            .records
            .update(&self.call_sid, |record| {
                record.insert("status".into(), json!("in_progress"));
                record.insert("stream_sid".into(), json!(self.stream_sid));
                record.insert("connected_at_ms".into(), json!(lemon_core::clock::now_ms()));
                record.insert("session_key".into(), json!(state.session_key.as_str()));
            })
            .await;
        tracing::info!(call = %self.call_sid, "call connected");
        if config.record_calls {
            self.start_recording();
        }
        let greeting = config.greeting.trim().to_owned();
        if !greeting.is_empty() {
            self.speak(&mut state, None, Source::Text(greeting), &events_tx);
        }
        let mut goodbye_deadline: Option<Instant> = None;
        let reason = loop {
            let speaking = state.reply.is_some() || !state.pending_marks.is_empty();
            let silence_at = if speaking || state.ending.is_some() {
                // Silence counts only while nobody speaks.
                Instant::now() + silence
            } else {
                state.silence_deadline
            };
            tokio::select! {
                biased;
                () = self.token.cancelled() => break EndReason::Shutdown,
                event = events.recv() => {
                    if let Some(event) = event {
                        self.on_reply_event(&mut state, event).await;
                    }
                }
                message = self.twilio.recv() => match message {
                    Some(FromTwilio::Mark(name)) => {
                        state.pending_marks.remove(&name);
                        if state.reply.is_none() && state.pending_marks.is_empty() {
                            state.silence_deadline = Instant::now() + silence;
                        }
                    }
                    Some(FromTwilio::Stop) | None => break EndReason::CallerHungUp,
                },
                heard = self.heard.recv() => match heard {
                    Some(heard) => self.on_heard(&mut state, heard, &events_tx, silence).await,
                    None => break EndReason::TranscriptionLost,
                },
                () = tokio::time::sleep_until(silence_at), if state.ending.is_none() => {
                    self.begin_goodbye(&mut state, EndReason::Silence, &events_tx).await;
                    goodbye_deadline = Some(Instant::now() + GOODBYE_WAIT);
                }
                () = tokio::time::sleep_until(max_deadline), if state.ending.is_none() => {
                    self.begin_goodbye(&mut state, EndReason::MaxDuration, &events_tx).await;
                    goodbye_deadline = Some(Instant::now() + GOODBYE_WAIT);
                }
                () = sleep_until_some(goodbye_deadline) => {
                    break state.ending.unwrap_or(EndReason::MaxDuration);
                }
            }
            if let Some(reason) = state.ending {
                // The goodbye has played: hang up.
                if state.reply.is_none() && state.pending_marks.is_empty() {
                    break reason;
                }
            }
        };
        self.finish(&mut state, reason).await;
    }

    async fn begin_goodbye(
        &self,
        state: &mut State,
        reason: EndReason,
        events: &mpsc::Sender<ReplyEvent>,
    ) {
        tracing::info!(call = %self.call_sid, reason = reason.as_str(), "ending the call");
        self.interrupt(state, false).await;
        state.ending = Some(reason);
        let goodbye = self.shared.config.goodbye.trim().to_owned();
        if !goodbye.is_empty() {
            self.speak(state, None, Source::Text(goodbye), events);
        }
    }

    async fn finish(&self, state: &mut State, reason: EndReason) {
        self.interrupt(state, false).await;
        // Hang up through the REST API when the gateway ends the call; the
        // stream closes either way.
        if reason != EndReason::CallerHungUp {
            if let Some(rest) = &self.shared.rest {
                if let Err(error) = rest.hang_up(&self.call_sid).await {
                    tracing::warn!(call = %self.call_sid, %error, "could not hang up through Twilio");
                }
            }
        }
        let _ = self.out.send(Out::Close).await;
        self.token.cancel();
        self.shared
            .records
            .update(&self.call_sid, |record| {
                record.insert("status".into(), json!("ended"));
                record.insert("end_reason".into(), json!(reason.as_str()));
                record.insert("ended_at_ms".into(), json!(lemon_core::clock::now_ms()));
            })
            .await;
        tracing::info!(call = %self.call_sid, reason = reason.as_str(), turns = state.turns, "call ended");
    }

    async fn on_heard(
        &self,
        state: &mut State,
        heard: Heard,
        events: &mpsc::Sender<ReplyEvent>,
        silence: Duration,
    ) {
        match heard {
            Heard::SpeechStarted => {
                // Voice activity, maybe noise: it holds off the silence timer only.
                state.silence_deadline = Instant::now() + silence;
            }
            Heard::Transcript { text, is_final, speech_final } => {
                let words = text.split_whitespace().count();
                if words == 0 {
                    if speech_final && !state.utterance.is_empty() {
                        self.end_turn(state, events).await;
                    }
                    return;
                }
                state.silence_deadline = Instant::now() + silence;
                if !is_final {
                    return;
                }
                let speaking = state.reply.is_some() || !state.pending_marks.is_empty();
                let config = &self.shared.config;
                if speaking && state.ending.is_none() {
                    if config.barge_in && words >= config.barge_in_min_words {
                        tracing::info!(call = %self.call_sid, words, "caller interrupted the answer");
                        self.interrupt(state, true).await;
                    } else {
                        // Heard while speaking and not an interruption: most
                        // likely our own voice coming back.
                        return;
                    }
                }
                if state.ending.is_some() {
                    return;
                }
                state.utterance.push(text);
                state.speech_end = Some(Instant::now());
                if speech_final {
                    self.end_turn(state, events).await;
                }
            }
            Heard::UtteranceEnd => {
                if !state.utterance.is_empty() && state.ending.is_none() {
                    self.end_turn(state, events).await;
                }
            }
        }
    }

    /// The caller's turn is over: submit it and speak the answer.
    async fn end_turn(&self, state: &mut State, events: &mpsc::Sender<ReplyEvent>) {
        let transcript_final = Instant::now();
        let prompt = std::mem::take(&mut state.utterance).join(" ");
        state.turns += 1;
        let turn = state.turns;
        state.timings.push(Timings {
            speech_end: state.speech_end.take().or(Some(transcript_final)),
            transcript_final: Some(transcript_final),
            ..Timings::default()
        });
        let mut req = RunRequest::new(state.session_key.clone(), prompt.clone());
        req.origin = Origin::Channel;
        req.engine = self.shared.engine.clone();
        // A caller speaking again replaces an answer still running.
        req.queue_mode = Some(QueueMode::Interrupt);
        req.channel = Some(ChannelRef {
            transport: crate::TRANSPORT_ID.to_owned(),
            chat_id: Some(self.from.clone()),
            topic_id: None,
        });
        req.meta.insert(
            "voice".into(),
            json!({ "call_sid": self.call_sid, "turn": turn, "from": self.from }),
        );
        self.shared
            .records
            .update(&self.call_sid, |record| {
                let turns = record.entry("turns").or_insert_with(|| json!([]));
                if let Some(list) = turns.as_array_mut() {
                    list.push(json!({ "turn": turn, "user": prompt, "at_ms": lemon_core::clock::now_ms() }));
                }
            })
            .await;
        match self.shared.router.submit(req).await {
            Ok(Submitted::Run(accepted, follower)) => {
                self.shared.refusals.accepted(&state.session_key);
                let id = self.speak(state, Some(turn), Source::Run(follower), events);
                let _ =
                    events.try_send(ReplyEvent::Accepted { reply: id, run_id: accepted.run_id });
            }
            Ok(Submitted::Command { reply, .. }) => {
                self.speak(state, Some(turn), Source::Text(reply), events);
            }
            Err(error) => {
                tracing::warn!(call = %self.call_sid, %error, "turn not accepted");
                // A caller hears an answer to every turn; only the first one
                // a failing store refuses says why at length.
                let sorry = match &error {
                    RouteError::Journal(_) => self
                        .shared
                        .refusals
                        .reply(&state.session_key, &error)
                        .unwrap_or_else(|| refused::STILL_FAILING.to_owned()),
                    _ => "Sorry, I can't answer right now.".to_owned(),
                };
                self.speak(state, Some(turn), Source::Text(sorry), events);
            }
        }
    }

    /// Stops the answer being spoken: `clear` to Twilio (when `clear`),
    /// synthesis dropped, its run cancelled.
    async fn interrupt(&self, state: &mut State, clear: bool) {
        let reply = state.reply.take();
        let playing = !state.pending_marks.is_empty();
        if reply.is_none() && !playing {
            return;
        }
        if let Some(reply) = &reply {
            reply.token.cancel();
        }
        if clear {
            let _ = self.out.send(Out::Text(twilio::clear_message(&self.stream_sid))).await;
        }
        state.pending_marks.clear();
        if let Some(run_id) = reply.as_ref().and_then(|reply| reply.run_id.as_ref()) {
            if let Err(error) = self.shared.router.cancel_run(run_id).await {
                tracing::debug!(call = %self.call_sid, %error, "run not cancelled");
            }
        }
        // The turn whose answer is cut off: being produced, or still playing.
        let turn = match &reply {
            Some(reply) => reply.turn,
            None => state.playing_turn,
        };
        state.playing_turn = None;
        if let Some(turn) = turn {
            self.shared
                .records
                .update(&self.call_sid, |record| {
                    if let Some(entry) = turn_entry(record, turn) {
                        entry.insert("interrupted".into(), json!(true));
                    }
                })
                .await;
        }
    }

    /// Starts speaking `source` (replacing nothing: the caller interrupts first).
    fn speak(
        &self,
        state: &mut State,
        turn: Option<usize>,
        source: Source,
        events: &mpsc::Sender<ReplyEvent>,
    ) -> u64 {
        if let Some(previous) = state.reply.take() {
            previous.token.cancel();
        }
        let id = state.next_reply;
        state.next_reply += 1;
        let token = self.token.child_token();
        let task = ReplyTask {
            id,
            source,
            speaker: self.shared.speaker.clone(),
            out: self.out.clone(),
            stream_sid: self.stream_sid.clone(),
            events: events.clone(),
        };
        let stop = token.clone();
        self.shared.tracker.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = task.run() => {}
            }
        });
        state.reply = Some(Reply { id, turn, token, run_id: None });
        state.playing_turn = turn;
        id
    }

    async fn on_reply_event(&self, state: &mut State, event: ReplyEvent) {
        let current = state.reply.as_mut();
        let (reply_id, turn) = match &current {
            Some(reply) => (reply.id, reply.turn),
            None => return,
        };
        let timings = turn.and_then(|turn| state.timings.get_mut(turn - 1));
        match event {
            ReplyEvent::Accepted { reply, run_id } if reply == reply_id => {
                if let Some(current) = state.reply.as_mut() {
                    current.run_id = Some(run_id.clone());
                }
                if let Some(turn) = turn {
                    self.shared
                        .records
                        .update(&self.call_sid, |record| {
                            if let Some(entry) = turn_entry(record, turn) {
                                entry.insert("run_id".into(), json!(run_id.as_str()));
                            }
                        })
                        .await;
                }
            }
            ReplyEvent::FirstDelta { reply, at } if reply == reply_id => {
                if let Some(t) = timings {
                    t.first_delta.get_or_insert(at);
                }
            }
            ReplyEvent::FirstTtsByte { reply, at, requested } if reply == reply_id => {
                if let Some(t) = timings {
                    if t.first_tts_byte.is_none() {
                        t.first_tts_byte = Some(at);
                        t.tts_requested = Some(requested);
                    }
                }
            }
            ReplyEvent::FirstAudio { reply, at } if reply == reply_id => {
                if let Some(t) = timings {
                    t.first_audio.get_or_insert(at);
                }
            }
            ReplyEvent::MarkSent { reply, name } if reply == reply_id => {
                state.pending_marks.insert(name);
            }
            ReplyEvent::Done { reply, answer } if reply == reply_id => {
                let finished = state.reply.take();
                if let Some(turn) = finished.and_then(|r| r.turn) {
                    let timings = state.timings.get(turn - 1).cloned().unwrap_or_default();
                    self.turn_done(turn, &answer, &timings).await;
                }
                if state.pending_marks.is_empty() {
                    state.silence_deadline = Instant::now()
                        + Duration::from_millis(self.shared.config.silence_timeout_ms);
                }
            }
            _ => {}
        }
    }

    /// Records the turn's answer and timings and publishes `voice_turn`.
    async fn turn_done(&self, turn: usize, answer: &str, timings: &Timings) {
        let timings = timings.to_json();
        self.shared
            .records
            .update(&self.call_sid, |record| {
                if let Some(entry) = turn_entry(record, turn) {
                    entry.insert("answer".into(), json!(answer));
                    entry.insert("timings".into(), timings.clone());
                }
            })
            .await;
        let mut body = serde_json::Map::new();
        body.insert("call_sid".into(), json!(self.call_sid));
        body.insert("turn".into(), json!(turn));
        body.insert("timings".into(), timings);
        self.shared.router.publish_notice(Notice {
            type_name: "voice_turn",
            ts_ms: lemon_core::clock::now_ms(),
            body,
        });
    }

    /// Asks Twilio to record the call (both sides, one channel each).
    fn start_recording(&self) {
        let Some(rest) = self.shared.rest.clone() else {
            tracing::warn!(call = %self.call_sid, "record_calls needs twilio_account_sid and twilio_auth_token; not recording");
            return;
        };
        let callback =
            format!("{}/webhooks/twilio/voice/recording", self.shared.config.public_base());
        let call_sid = self.call_sid.clone();
        self.shared.tracker.spawn(async move {
            if let Err(error) = rest.start_recording(&call_sid, &callback).await {
                tracing::warn!(call = %call_sid, %error, "could not start the recording");
            }
        });
    }
}

fn turn_entry(
    record: &mut serde_json::Map<String, Value>,
    turn: usize,
) -> Option<&mut serde_json::Map<String, Value>> {
    record
        .get_mut("turns")?
        .as_array_mut()?
        .iter_mut()
        .find(|entry| entry["turn"] == json!(turn))?
        .as_object_mut()
}

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// What an answer speaks.
enum Source {
    Text(String),
    Run(RunFollower),
}

struct ReplyTask {
    id: u64,
    source: Source,
    speaker: Speaker,
    out: mpsc::Sender<Out>,
    stream_sid: String,
    events: mpsc::Sender<ReplyEvent>,
}

impl ReplyTask {
    async fn run(self) {
        let ReplyTask { id, source, speaker, out, stream_sid, events } = self;
        let (sentences_tx, mut sentences_rx) = mpsc::channel::<String>(32);
        let produce = {
            let events = events.clone();
            async move {
                match source {
                    Source::Text(text) => {
                        let _ = sentences_tx.send(text.clone()).await;
                        text
                    }
                    Source::Run(follower) => follow(id, follower, &sentences_tx, &events).await,
                }
            }
        };
        let speak = async {
            let mut marks = 0;
            while let Some(sentence) = sentences_rx.recv().await {
                speak_sentence(id, &speaker, &sentence, &out, &stream_sid, &events).await;
                marks += 1;
                let name = format!("r{id}-{marks}");
                let _ = events.send(ReplyEvent::MarkSent { reply: id, name: name.clone() }).await;
                let _ = out.send(Out::Text(twilio::mark_message(&stream_sid, &name))).await;
            }
        };
        let (answer, ()) = tokio::join!(produce, speak);
        let _ = events.send(ReplyEvent::Done { reply: id, answer }).await;
    }
}

/// Follows the run, passing each completed sentence on; the whole answer.
async fn follow(
    id: u64,
    mut follower: RunFollower,
    sentences: &mpsc::Sender<String>,
    events: &mpsc::Sender<ReplyEvent>,
) -> String {
    let mut split = Sentences::default();
    let mut answer = String::new();
    let mut failed = false;
    while let Some(followed) = follower.next().await {
        let text = match followed.event().map(|event| &event.kind) {
            Some(EventKind::Delta { text, .. }) => Some(text.clone()),
            Some(EventKind::RunCompleted { completion, .. }) => {
                if answer.trim().is_empty() && !completion.answer.trim().is_empty() {
                    answer.clone_from(&completion.answer);
                    for sentence in split.push(&completion.answer) {
                        let _ = sentences.send(sentence).await;
                    }
                }
                failed = !completion.ok && answer.trim().is_empty();
                break;
            }
            Some(_) => None,
            None if followed.type_name() == "delta" => {
                followed.to_json()["text"].as_str().map(str::to_owned)
            }
            None => None,
        };
        if let Some(text) = text {
            if answer.is_empty() {
                let _ = events.send(ReplyEvent::FirstDelta { reply: id, at: Instant::now() }).await;
            }
            answer.push_str(&text);
            for sentence in split.push(&text) {
                let _ = sentences.send(sentence).await;
            }
        }
    }
    if let Some(rest) = split.finish() {
        let _ = sentences.send(rest).await;
    }
    if failed {
        let sorry = "Sorry, something went wrong.".to_owned();
        let _ = sentences.send(sorry.clone()).await;
        return sorry;
    }
    answer
}

/// Speaks one sentence: ElevenLabs' audio, sent on as 20 ms `media` frames.
async fn speak_sentence(
    id: u64,
    speaker: &Speaker,
    sentence: &str,
    out: &mpsc::Sender<Out>,
    stream_sid: &str,
    events: &mpsc::Sender<ReplyEvent>,
) {
    let requested = Instant::now();
    let stream = match speaker.speak(sentence).await {
        Ok(stream) => stream,
        Err(error) => {
            tracing::warn!(%error, "a sentence could not be spoken");
            return;
        }
    };
    let mut stream = std::pin::pin!(stream);
    let mut first = true;
    let mut carry: Vec<u8> = Vec::with_capacity(FRAME_BYTES);
    while let Some(chunk) = stream.next().await {
        let chunk: Bytes = match chunk {
            Ok(chunk) => chunk,
            Err(error) => {
                tracing::warn!(%error, "speech stopped mid-sentence");
                break;
            }
        };
        if chunk.is_empty() {
            continue;
        }
        if first {
            let at = Instant::now();
            let _ = events.send(ReplyEvent::FirstTtsByte { reply: id, at, requested }).await;
        }
        carry.extend_from_slice(&chunk);
        let whole = carry.len() - carry.len() % FRAME_BYTES;
        // The first audio goes out at once, even short of a whole frame.
        let cut = if first && whole == 0 { carry.len() } else { whole };
        for frame in carry[..cut].chunks(FRAME_BYTES) {
            if out.send(Out::Text(twilio::media_message(stream_sid, frame))).await.is_err() {
                return;
            }
        }
        carry.drain(..cut);
        if first {
            first = false;
            let _ = events.send(ReplyEvent::FirstAudio { reply: id, at: Instant::now() }).await;
        }
    }
    if !carry.is_empty() {
        let _ = out.send(Out::Text(twilio::media_message(stream_sid, &carry))).await;
    }
}
