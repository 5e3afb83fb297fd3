//! The answers to refused messages: a failing store told once per
//! conversation until one of its requests is accepted, other refusals every
//! time; and the same against a real router whose store stops saving.

use std::sync::Arc;
use std::time::Duration;

use lemon_core::bus::EventKind;
use lemon_core::engine::EngineRegistry;
use lemon_core::gateway::{GatewayDeps, GatewayHandle, RuntimeConfig};
use lemon_core::ids::SessionKey;
use lemon_core::router::{RouteError, RouterConfig, RouterHandle, RunRequest, Submitted};
use lemon_core::store::{StoreError, StoreHandle};
use lemon_core::testing::within;
use lemon_engines::echo::EchoEngine;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Refusals, StoreNotice, REMEMBERED_CONVERSATIONS};

/// What happens in a conversation, in order.
enum Step {
    /// The router refused a message of this conversation with this error.
    Refused(&'static str, RouteError),
    /// A message of this conversation was accepted.
    Accepted(&'static str),
}

fn disk_full() -> RouteError {
    RouteError::Journal(StoreError::Database(
        "disk I/O error at /home/me/.lemon/lemon.db: database or disk is full".to_owned(),
    ))
}

/// Runs `steps` and checks the answer to each refusal, in order.
fn check(steps: Vec<Step>, expected: &[Option<&str>]) {
    let refusals = Refusals::new(StoreNotice::SendAgain);
    let mut answers = Vec::new();
    for step in steps {
        match step {
            Step::Refused(session, error) => {
                answers.push(refusals.reply(&SessionKey::from(session), &error));
            }
            Step::Accepted(session) => refusals.accepted(&SessionKey::from(session)),
        }
    }
    let answers: Vec<Option<&str>> = answers.iter().map(Option::as_deref).collect();
    assert_eq!(answers, expected);
}

const NOTICE: &str = "The gateway cannot save messages right now (its storage is failing), \
                      so nothing was accepted. Please send it again later.";

#[test]
fn a_failing_store_is_told_once_per_conversation() {
    check(
        vec![
            Step::Refused("chat-a", disk_full()),
            Step::Refused("chat-a", disk_full()),
            Step::Refused("chat-b", disk_full()),
            Step::Refused("chat-a", disk_full()),
        ],
        &[Some(NOTICE), None, Some(NOTICE), None],
    );
}

#[test]
fn an_accepted_request_lets_the_next_failure_be_told_again() {
    check(
        vec![
            Step::Refused("chat-a", disk_full()),
            Step::Accepted("chat-b"),
            Step::Refused("chat-a", disk_full()),
            Step::Accepted("chat-a"),
            Step::Refused("chat-a", disk_full()),
            Step::Refused("chat-a", disk_full()),
        ],
        &[Some(NOTICE), None, Some(NOTICE), None],
    );
}

#[test]
fn other_refusals_are_answered_every_time_in_their_own_words() {
    let full = || RouteError::QueueFull { cap: 3 };
    check(
        vec![
            Step::Refused("chat-a", full()),
            Step::Refused("chat-a", full()),
            Step::Refused("chat-a", disk_full()),
            Step::Refused("chat-a", full()),
        ],
        &[
            Some("Not accepted: this conversation already has 3 requests waiting; try again once one has run"),
            Some("Not accepted: this conversation already has 3 requests waiting; try again once one has run"),
            Some(NOTICE),
            Some("Not accepted: this conversation already has 3 requests waiting; try again once one has run"),
        ],
    );
}

#[test]
fn the_notice_names_no_path_and_no_database_message() {
    for notice in [StoreNotice::SendAgain, StoreNotice::Kept] {
        let text = Refusals::new(notice).reply(&SessionKey::from("s"), &disk_full()).unwrap();
        for leak in ["/", "lemon.db", "disk I/O", "database", "SQLite", "journal"] {
            assert!(!text.contains(leak), "{text:?} names {leak:?}");
        }
        assert!(text.contains("storage is failing"), "{text}");
    }
    assert!(StoreNotice::Kept.text().contains("no need to send it again"));
}

#[test]
fn the_memory_of_told_conversations_is_bounded() {
    let refusals = Refusals::new(StoreNotice::SendAgain);
    for n in 0..REMEMBERED_CONVERSATIONS + 10 {
        let session = SessionKey::from(format!("chat-{n}").as_str());
        assert!(refusals.reply(&session, &disk_full()).is_some());
    }
    assert!(refusals.told.lock().unwrap().len() <= REMEMBERED_CONVERSATIONS);
}

/// A router on a SQLite store running the echo engine.
struct Gateway {
    router: RouterHandle,
    tracker: TaskTracker,
    token: CancellationToken,
}

impl Gateway {
    fn start(store: StoreHandle) -> Gateway {
        let tracker = TaskTracker::new();
        let token = CancellationToken::new();
        let mut engines = EngineRegistry::new();
        engines.register(Arc::new(EchoEngine::new(Duration::ZERO, tracker.clone()))).unwrap();
        let deps = GatewayDeps {
            config: RuntimeConfig::default(),
            engines,
            store,
            bus: lemon_core::bus::EventBus::default(),
        };
        let gateway = GatewayHandle::start(deps, token.clone(), &tracker);
        let config =
            RouterConfig { default_engine: "echo".parse().unwrap(), ..RouterConfig::default() };
        let router = RouterHandle::start(config, gateway, token.clone(), &tracker);
        Gateway { router, tracker, token }
    }

    /// Submits `prompt` in `session` as a channel does: the answer to the
    /// user when it was refused, `None` when it was accepted (its answer
    /// awaited) or when the user is not told again.
    async fn message(&self, refusals: &Refusals, session: &str, prompt: &str) -> Reply {
        let session = SessionKey::from(session);
        let submitted =
            within("submit", self.router.submit(RunRequest::new(session.clone(), prompt)));
        match submitted.await {
            Ok(Submitted::Run(_, mut follower)) => {
                refusals.accepted(&session);
                let answer = within("the answer", async {
                    while let Some(followed) = follower.next().await {
                        if let Some(EventKind::RunCompleted { completion, .. }) =
                            followed.completed().map(|event| &event.kind)
                        {
                            return completion.answer.clone();
                        }
                    }
                    panic!("the run ended without its completion");
                });
                Reply::Answered(answer.await)
            }
            Ok(Submitted::Command { reply, .. }) => Reply::Answered(reply),
            Err(error) => match refusals.reply(&session, &error) {
                Some(text) => Reply::Refused(text),
                None => Reply::Silent,
            },
        }
    }

    async fn stop(self) {
        self.token.cancel();
        self.tracker.close();
        within("the gateway to stop", self.tracker.wait()).await;
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Answered(String),
    Refused(String),
    Silent,
}

/// Another connection to the store's file whose trigger makes every journal
/// insert fail, as a full disk would, until dropped.
struct FailingJournal(rusqlite::Connection);

impl FailingJournal {
    fn start(path: &std::path::Path) -> FailingJournal {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn.execute_batch(
            "CREATE TRIGGER no_journal BEFORE INSERT ON journal \
             BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;",
        )
        .unwrap();
        FailingJournal(conn)
    }

    fn stop(self) {
        self.0.execute_batch("DROP TRIGGER no_journal;").unwrap();
    }
}

#[tokio::test]
async fn a_router_whose_store_fails_gets_one_notice_per_conversation_then_answers_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lemon.db");
    let store = StoreHandle::open_sqlite(&path).unwrap();
    let gateway = Gateway::start(store);
    let refusals = Refusals::new(StoreNotice::SendAgain);
    let notice = Reply::Refused(NOTICE.to_owned());
    assert_eq!(
        gateway.message(&refusals, "chat-a", "before").await,
        Reply::Answered("before".to_owned())
    );

    let failing = FailingJournal::start(&path);
    assert_eq!(gateway.message(&refusals, "chat-a", "one").await, notice);
    assert_eq!(gateway.message(&refusals, "chat-a", "two").await, Reply::Silent);
    assert_eq!(gateway.message(&refusals, "chat-b", "three").await, notice);

    failing.stop();
    assert_eq!(
        gateway.message(&refusals, "chat-a", "after").await,
        Reply::Answered("after".to_owned())
    );
    // Accepted again: the next failure is news to chat-a, not yet to chat-b.
    let failing = FailingJournal::start(&path);
    assert_eq!(gateway.message(&refusals, "chat-a", "again").await, notice);
    assert_eq!(gateway.message(&refusals, "chat-b", "again").await, Reply::Silent);
    failing.stop();
    gateway.stop().await;
}
