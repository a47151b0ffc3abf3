//! `guest-sdk/c/spear.h` carries a generated copy of this crate's numbers and import
//! signatures; this test keeps the copy equal to the crate. With `QUIVER_BLESS=1` it
//! rewrites the block instead of failing.

use std::path::PathBuf;

use quiver_abi::c::{BEGIN_MARKER, END_MARKER};

const BLESS_HINT: &str = "run `QUIVER_BLESS=1 cargo test -p quiver-abi` to update";

fn header_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../c/spear.h")
}

fn generated() -> String {
    let mut block = String::new();
    quiver_abi::write_c_header_block(&mut block).expect("writing to a String");
    block
}

/// The header with its generated block replaced by `block`.
fn with_block(header: &str, block: &str) -> String {
    let begin = header
        .find(BEGIN_MARKER)
        .unwrap_or_else(|| panic!("spear.h lacks the line {BEGIN_MARKER}"));
    let inner_start = begin + BEGIN_MARKER.len();
    let end = header[inner_start..]
        .find(END_MARKER)
        .map(|at| inner_start + at)
        .unwrap_or_else(|| panic!("spear.h lacks the line {END_MARKER} after the BEGIN line"));
    format!("{}\n{block}{}", &header[..inner_start], &header[end..])
}

#[test]
fn the_c_header_carries_the_crates_constants_and_imports() {
    let path = header_path();
    let header =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let expected = with_block(&header, &generated());
    if expected == header {
        return;
    }
    if std::env::var_os("QUIVER_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &expected).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!("rewrote the generated block of {}", path.display());
        return;
    }
    let first_difference = header
        .lines()
        .zip(expected.lines())
        .position(|(a, b)| a != b)
        .map(|i| i + 1)
        .unwrap_or_else(|| header.lines().count().min(expected.lines().count()) + 1);
    panic!(
        "the generated block of {} is out of date (first difference on line {first_difference}); {BLESS_HINT}",
        path.display()
    );
}

#[test]
fn the_generated_block_declares_every_import_and_number() {
    let block = generated();
    for import in quiver_abi::IMPORTS {
        assert!(
            block.contains(&format!("SPEAR_IMPORT(\"{0}\") ", import.name))
                && block.contains(&format!(
                    " sp_{}(",
                    import.name.strip_prefix("spear_").unwrap_or(import.name)
                )),
            "{} is not declared:\n{block}",
            import.name
        );
    }
    for errno in quiver_abi::Errno::ALL {
        let line = format!("    SPEAR_{} = {},", errno.name().unwrap(), errno.raw());
        assert!(block.contains(&line), "missing `{line}`");
    }
    assert!(block.contains("SPEAR_CCHAT_SEND_FLAG_ENABLE_METRICS = 1,"));
    assert!(block.contains("SPEAR_CCHAT_SEND_FLAG_AUTO_TOOL_CALL = 2,"));
    assert!(block.contains("SPEAR_CCHAT_CTL_SET_PARAM = 1,"));
    assert!(block.contains("SP_LOG_ERROR = 4,"));
    assert!(block.contains("SPEAR_EPOLLIN = 1,"));
    assert!(block.contains("SPEAR_EPOLLHUP = 16,"));
    assert!(block.contains("SPEAR_EPOLL_CTL_DEL = 3,"));
    assert!(block.contains("SPEAR_FD_CTL_GET_METRICS = 5,"));
    assert!(block.contains("SPEAR_IMPORT(\"sleep_ms\") void sp_sleep_ms(int32_t ms);"));
    assert!(block.contains(
        "SPEAR_IMPORT(\"spear_epoll_wait\") int32_t sp_epoll_wait(int32_t epfd, int32_t out_ptr, int32_t out_len_ptr, int32_t timeout_ms);"
    ));
    assert!(block.contains("SPEAR_IMPORT(\"time_now_ms\") int64_t sp_time_now_ms(void);"));
    assert!(block.contains(
        "SPEAR_IMPORT(\"log\") int32_t sp_log(int32_t level, int32_t ptr, int32_t len);"
    ));
}
