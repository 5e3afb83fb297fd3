//! Which images are read and kept within one request's bounds.

use super::*;

const GIF: &[u8] = b"GIF89a\x01\x00\x01\x00";

fn image(size: usize) -> ImageInput {
    let mut data = GIF.to_vec();
    data.resize(size, 0);
    ImageInput::new("image/gif", data)
}

fn with_images(sizes: &[usize]) -> ChatMessage {
    ChatMessage::User { text: "t".into(), images: sizes.iter().map(|&n| image(n)).collect() }
}

fn counts(messages: &[ChatMessage]) -> Vec<usize> {
    messages.iter().map(|m| m.images().len()).collect()
}

#[test]
fn the_history_keeps_the_newest_images_within_a_requests_bounds() {
    let mb = 1024 * 1024;
    // 4 + 4 + 4 + 4 + 4 MiB fills the 20 MiB; one more 4 MiB image, the
    // newest, pushes out the oldest.
    let mut messages = vec![
        with_images(&[4 * mb, 4 * mb]),
        ChatMessage::user("no picture"),
        with_images(&[4 * mb, 4 * mb]),
        with_images(&[4 * mb, 4 * mb]),
    ];
    keep_newest(&mut messages);
    assert_eq!(counts(&messages), [1, 0, 2, 2]);
    let mut many = vec![with_images(&[100; 15]), with_images(&[100; 10])];
    keep_newest(&mut many);
    assert_eq!(counts(&many), [MAX_IMAGES - 10, 10]);
    assert!(drop_all(&mut many));
    assert_eq!(counts(&many), [0, 0]);
    assert!(!drop_all(&mut many), "nothing left to drop");
}

#[tokio::test]
async fn reading_stops_where_the_room_ends_and_skips_what_is_no_image() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        ImageRef { path, mime: "image/png".into() }
    };
    let refs = vec![
        write("a.gif", GIF),
        write("text.png", b"not an image"),
        write("b.gif", GIF),
        write("c.gif", GIF),
    ];
    let mut room = Room { images: 2, bytes: 1000 };
    let read = read(refs, &OffLimits::none(), &mut room).await;
    let paths: Vec<_> = read.iter().map(|i| i.path.clone().unwrap()).collect();
    assert_eq!(paths, [dir.join("a.gif"), dir.join("b.gif")]);
    assert!(
        read.iter().all(|i| i.mime == "image/gif" && i.data == GIF),
        "the bytes decide the type"
    );
    assert_eq!(room, Room { images: 0, bytes: 1000 - 2 * GIF.len() as u64 });
}

#[tokio::test]
async fn nothing_inside_the_gateways_state_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let path = dir.join("secret.gif");
    std::fs::write(&path, GIF).unwrap();
    let off_limits = OffLimits::new([dir.clone()], []);
    let refs = vec![ImageRef { path, mime: "image/gif".into() }];
    let mut room = Room::REQUEST;
    assert!(read(refs, &off_limits, &mut room).await.is_empty());
    assert_eq!(room, Room::REQUEST);
}
