/*
 * A guest written the way SPEAR's C samples are (samples/wasm-c of lfedgeai/SPEAR): it
 * includes <spear.h>, uses only the API surface those samples use, and prints with
 * printf, which the header turns into log lines. tests/c_guest.rs builds it against
 * guest-sdk/c/spear.h and checks the log lines and what the model was sent.
 */
#include <spear.h>

static uint8_t TOOL_ARENA[64 * 1024];

/* The integer after `"key":` in args, or fallback. */
static int32_t int_field(const char *s, int32_t len, const char *key, int32_t fallback) {
    size_t key_len = strlen(key);
    for (const char *p = s, *end = s + len; p + key_len + 2 < end; p++) {
        if (*p != '"' || memcmp(p + 1, key, key_len) != 0 || p[key_len + 1] != '"') {
            continue;
        }
        const char *q = p + key_len + 2;
        while (q < end && (*q == ':' || *q == ' ')) {
            q++;
        }
        return (int32_t)strtol(q, NULL, 10);
    }
    return fallback;
}

/* The tool `sum(a, b)`, returning {"sum": a+b} with the buffer protocol. */
int32_t sum(int32_t args_ptr, int32_t args_len, int32_t out_ptr, int32_t out_len_ptr) {
    const char *args = (const char *)(uintptr_t)args_ptr;
    int32_t a = int_field(args, args_len, "a", 0);
    int32_t b = int_field(args, args_len, "b", 0);
    char result[64];
    int n = snprintf(result, sizeof(result), "{\"sum\":%d}", a + b);
    if (n <= 0 || (size_t)n >= sizeof(result)) {
        return -SPEAR_EIO;
    }
    uint32_t cap = *(uint32_t *)(uintptr_t)out_len_ptr;
    printf("sum invoked: a=%d b=%d nul_after_args=%d\n", a, b, args[args_len] == 0);
    if (cap < (uint32_t)n) {
        *(uint32_t *)(uintptr_t)out_len_ptr = (uint32_t)n;
        return -SPEAR_ENOSPC;
    }
    memcpy((void *)(uintptr_t)out_ptr, result, (size_t)n);
    *(uint32_t *)(uintptr_t)out_len_ptr = (uint32_t)n;
    return 0;
}

int main() {
    int64_t now = sp_time_now_ms();
    printf("time_now_ms_plausible=%d\n", now > 1600000000000LL);

    int32_t fd = sp_cchat_create();
    if (fd < 0) {
        printf("cchat_create failed: %d\n", fd);
        return 1;
    }
    int32_t rc = sp_cchat_set_param_string(fd, "model", "compat-model");
    printf("set_model_rc=%d\n", rc);
    rc = sp_cchat_set_param_u32(fd, "timeout_ms", 30000);
    printf("set_timeout_rc=%d\n", rc);
    sp_cchat_set_param_u32(fd, "tool_arena_ptr", (uint32_t)(uintptr_t)TOOL_ARENA);
    sp_cchat_set_param_u32(fd, "tool_arena_len", (uint32_t)sizeof(TOOL_ARENA));
    sp_cchat_set_param_u32(fd, "max_total_tool_calls", 4);
    sp_cchat_set_param_u32(fd, "max_iterations", 4);

    /* Hostile strings: the helper escapes them into valid JSON the host accepts. */
    rc = sp_cchat_set_param_string(fd, "user", "q\"uote \\back\nnl\ttab\x01\x1f caf\xc3\xa9 }{");
    printf("set_hostile_rc=%d\n", rc);
    rc = sp_cchat_set_param_string(fd, "x-\"key\\\n", "v");
    printf("set_hostile_key_rc=%d\n", rc);

    const char json[] = "{\"key\":\"temperature\",\"value\":0.25}";
    rc = sp_cchat_set_param_json(fd, json, (uint32_t)strlen(json));
    printf("set_json_rc=%d\n", rc);
    rc = sp_cchat_set_param_json(fd, "{not json", 9);
    printf("malformed_json_is_internal=%d eio=%d\n", rc == SPEAR_CCHAT_ERR_INTERNAL,
           rc == -SPEAR_EIO);

    rc = sp_cchat_write_msg_str(fd, "user", "Please call sum(a,b) for a=7 and b=35.");
    printf("write_msg_rc=%d\n", rc);
    const char *fn_json =
        "{\"type\":\"function\",\"function\":{\"name\":\"sum\",\"description\":\"Add two "
        "integers\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
        "\"integer\"},\"b\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"]}}}";
    rc = sp_cchat_write_fn_str(fd, (int32_t)(uintptr_t)sum, fn_json);
    printf("write_fn_rc=%d\n", rc);

    int32_t resp_fd = sp_cchat_send(fd, AUTO_TOOL_CALL);
    if (resp_fd < 0) {
        printf("cchat_send failed: %d\n", resp_fd);
        return 1;
    }
    uint32_t resp_len = 0;
    uint8_t *resp = sp_cchat_recv_alloc(resp_fd, &resp_len);
    if (!resp) {
        printf("cchat_recv_alloc failed\n");
        return 1;
    }
    printf("response_len_matches=%d\n", resp_len == strlen((char *)resp));
    printf("response_has_answer=%d\n", strstr((char *)resp, "7 + 35 = 42") != NULL);

    /* The buffer protocol underneath: a 4-byte buffer gets -ENOSPC and the full length. */
    uint8_t tiny[4];
    uint32_t cap = sizeof(tiny);
    rc = sp_cchat_recv(resp_fd, (int32_t)(uintptr_t)tiny, (int32_t)(uintptr_t)&cap);
    printf("small_recv_enospc=%d needed_is_len=%d\n", rc == -SPEAR_ENOSPC, cap == resp_len);

    free(resp);
    sp_cchat_close(resp_fd);
    sp_cchat_close(fd);
    fprintf(stderr, "stderr goes to the error level\n");
    puts("puts goes to the info level");
    return 0;
}
