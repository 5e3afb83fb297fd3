use super::*;

#[test]
fn chunks_concatenate_back_to_the_prompt() {
    for text in ["hello world", "  leading and trailing  ", "one", "", "multi\nline\n\ttext é ü"]
    {
        assert_eq!(chunks(text).concat(), text);
    }
    assert_eq!(chunks("a b  c"), vec!["a ", "b  ", "c"]);
}

fn request(prompt: &str) -> StartRequest {
    StartRequest {
        run_id: lemon_core::ids::RunId::parse("run-1").unwrap(),
        session_key: "s".into(),
        prompt: prompt.to_owned(),
        resume: None,
        cwd: std::env::temp_dir(),
        model: None,
        meta: Default::default(),
        workspace: None,
        off_limits: lemon_core::contain::OffLimits::none(),
        attachments: Vec::new(),
    }
}

async fn collect(engine: &EchoEngine, prompt: &str, capacity: usize) -> Vec<EngineEvent> {
    let (sink, mut rx) = EventSink::channel(capacity);
    let _control = engine.start(request(prompt), sink).await.unwrap();
    let mut out = Vec::new();
    while let Some(event) = rx.recv().await {
        let done = matches!(event, EngineEvent::Completed(_));
        out.push(event);
        if done {
            break;
        }
    }
    out
}

#[tokio::test]
async fn streams_started_words_and_completed_with_a_resume_token() {
    let engine = EchoEngine::new(Duration::ZERO, TaskTracker::new());
    for capacity in [64, 2] {
        let events = collect(&engine, "hello big world", capacity).await;
        let resume = Some(ResumeToken::new("echo", "run-1"));
        assert!(matches!(&events[0], EngineEvent::Started { resume: r, .. } if *r == resume));
        let deltas: Vec<&str> = events
            .iter()
            .filter_map(|e| if let EngineEvent::Delta(t) = e { Some(t.as_str()) } else { None })
            .collect();
        assert_eq!(deltas, ["hello ", "big ", "world"]);
        assert_eq!(events.last(), Some(&EngineEvent::Completed(Completion::success("", resume))));
    }
}

#[tokio::test(start_paused = true)]
async fn cancel_stops_a_delayed_stream() {
    let engine = EchoEngine::new(Duration::from_millis(100), TaskTracker::new());
    let (sink, mut rx) = EventSink::channel(8);
    let control = engine.start(request("a b c d e f"), sink).await.unwrap();
    assert!(matches!(rx.recv().await, Some(EngineEvent::Started { .. })));
    assert_eq!(rx.recv().await, Some(EngineEvent::Delta("a ".to_owned())));
    control.cancel();
    control.cancel();
    // The task ends without a completion; the channel closes.
    assert_eq!(rx.recv().await, None);
}

#[tokio::test]
async fn a_resumed_run_reports_the_session_it_continued() {
    let engine = EchoEngine::new(Duration::ZERO, TaskTracker::new());
    let (sink, mut rx) = EventSink::channel(16);
    let req =
        StartRequest { resume: Some(ResumeToken::new("echo", "first-run")), ..request("again") };
    let _control = engine.start(req, sink).await.unwrap();
    let resume = Some(ResumeToken::new("echo", "first-run"));
    assert!(matches!(rx.recv().await, Some(EngineEvent::Started { resume: r, .. }) if r == resume));
    let mut last = None;
    while let Some(event) = rx.recv().await {
        last = Some(event);
    }
    assert_eq!(last, Some(EngineEvent::Completed(Completion::success("", resume))));
}
