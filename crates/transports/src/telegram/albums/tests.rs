use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{collect, Albums};

fn albums(ms: u64) -> Arc<Mutex<Albums<&'static str>>> {
    Arc::new(Mutex::new(Albums::new(Duration::from_millis(ms))))
}

#[tokio::test(start_paused = true)]
async fn an_album_is_one_message_once_it_has_been_quiet_for_the_window() {
    let albums = albums(1000);
    assert!(albums.lock().unwrap().push("1:g", "first photo", Instant::now()));
    let waiter = {
        let albums = albums.clone();
        tokio::spawn(async move { collect(&albums, "1:g").await })
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!albums.lock().unwrap().push("1:g", "second photo", Instant::now()), "joins");
    // A second album of another chat is apart.
    assert!(albums.lock().unwrap().push("2:g", "elsewhere", Instant::now()));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!waiter.is_finished(), "the window restarted with the second photo");
    let started = Instant::now();
    let items = waiter.await.unwrap();
    assert_eq!(items, ["first photo", "second photo"]);
    assert_eq!(started.elapsed(), Duration::from_millis(400), "1 s after the last photo");
    assert_eq!(collect(&albums, "2:g").await, ["elsewhere"]);
    assert!(collect(&albums, "1:g").await.is_empty(), "taken once");
}

#[tokio::test(start_paused = true)]
async fn a_photo_after_its_album_went_starts_a_new_one() {
    let albums = albums(500);
    assert!(albums.lock().unwrap().push("1:g", "a", Instant::now()));
    assert_eq!(collect(&albums, "1:g").await, ["a"]);
    assert!(albums.lock().unwrap().push("1:g", "late", Instant::now()), "a new album");
    assert_eq!(collect(&albums, "1:g").await, ["late"]);
}
