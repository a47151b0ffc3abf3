/*
 * The work guest-sdk/c/spear.h does itself, against a real host: JSON escaping of
 * params, the growing *_alloc helpers and their bounds, error codes, long log lines.
 * Prints `name=value` lines to stdout; tests/c_guest.rs checks them and what the model
 * was sent. Built with -DSPEAR_ALLOC_MAX=100000 so the bound is cheap to hit.
 */
#define SPEAR_DISABLE_STDIO_REDIRECT_TO_LOG
#include "spear.h"

/* Every ASCII control character, quotes, backslashes, a slash and multi-byte UTF-8. */
static char hostile[64];

static void fill_hostile(void) {
    size_t n = 0;
    for (int c = 1; c < 0x20; c++) {
        hostile[n++] = (char)c;
    }
    const char tail[] = "\"\\/'}{\xc3\xa9\xf0\x9f\xa6\x80";
    memcpy(hostile + n, tail, sizeof tail);
}

static char *text_of(int32_t fd, const char *tool, const char *args, uint32_t *len, int32_t *rc) {
    return (char *)sp_mcp_call_tool_alloc(fd, tool, args, len, rc);
}

int main(void) {
    fill_hostile();
    int32_t fd = sp_cchat_create();
    printf("hostile_value=%d\n", (int)sp_cchat_set_param_string(fd, "hostile", hostile));
    printf("hostile_key=%d\n", (int)sp_cchat_set_param_string(fd, hostile, "key"));
    printf("u32_max=%d\n", (int)sp_cchat_set_param_u32(fd, "max_u32", UINT32_MAX));
    printf("value_json=%d\n", (int)sp_cchat_set_param_value_json(fd, "seed", "[1,{\"a\":null}]"));

    /* A 60000-byte value: built on the heap, no fixed-size buffer. */
    char *long_value = (char *)malloc(60001);
    memset(long_value, 'v', 60000);
    long_value[60000] = 0;
    printf("long_value=%d\n", (int)sp_cchat_set_param_string(fd, "long", long_value));
    free(long_value);

    printf("null_key_internal=%d\n",
           sp_cchat_set_param_string(fd, NULL, "x") == SPEAR_CCHAT_ERR_INTERNAL);
    printf("null_msg_invalid_ptr=%d\n",
           sp_cchat_write_msg_str(fd, "user", NULL) == SPEAR_CCHAT_ERR_INVALID_PTR);
    printf("bad_role_einval=%d\n", sp_cchat_write_msg_str(fd, "robot", "hi") == -SPEAR_EINVAL);

    sp_cchat_write_msg_str(fd, "user", "hi");
    int32_t resp_fd = sp_cchat_send(fd, 0);
    uint32_t len = 0;
    uint8_t *resp = sp_cchat_recv_alloc(resp_fd, &len);
    printf("recv=%d\n", resp != NULL && len > 0 && resp[len] == 0);
    free(resp);
    char *messages = (char *)sp_cchat_get_messages_alloc(fd, NULL, NULL);
    printf("messages_has_answer=%d\n", messages && strstr(messages, "\"scripted hello\"") != NULL);
    free(messages);
    printf("recv_bad_fd_null=%d\n", sp_cchat_recv_alloc(12345, &len) == NULL && len == 0);
    sp_cchat_close(resp_fd);
    sp_cchat_close(fd);

    /* MCP through the growing helpers. */
    int32_t rc = 0;
    printf("registry_get_unknown=%d\n",
           sp_mcp_registry_get_alloc("nope", NULL, &rc) == NULL && rc == -SPEAR_ENOENT);
    char *entry = (char *)sp_mcp_registry_get_alloc("fixture", NULL, &rc);
    printf("registry_get=%d\n", entry != NULL && rc > 0 && strstr(entry, "\"fixture\"") != NULL);
    free(entry);
    printf("open_unknown=%d\n", sp_mcp_open_str("nope") == -SPEAR_ENOENT);
    printf("call_bad_fd=%d\n",
           text_of(999999, "add", "{}", NULL, &rc) == NULL && rc == -SPEAR_EBADF);
    int32_t mfd = sp_mcp_open_str("fixture");
    char *r = text_of(mfd, "big", "{\"bytes\": 40000}", &len, &rc);
    printf("big_grown=%d\n", r != NULL && rc == (int32_t)len && len > 40000 && r[len] == 0);
    free(r);
    r = text_of(mfd, "big", "{\"bytes\": 150000}", &len, &rc);
    printf("big_over_alloc_max_enomem=%d\n", r == NULL && rc == -SPEAR_ENOMEM);
    r = text_of(mfd, "add", "{\"a\": 1", &len, &rc);
    printf("malformed_args_eio=%d\n", r == NULL && rc == -SPEAR_EIO);
    r = text_of(mfd, "delete_file", "{}", &len, &rc);
    printf("denied_tool_eacces=%d\n", r == NULL && rc == -SPEAR_EACCES);
    r = text_of(mfd, "count", NULL, &len, &rc);
    const char *text = r ? strstr(r, "\"text\":\"") : NULL;
    printf("count=%ld\n", text ? strtol(text + 8, NULL, 10) : -1L);
    free(r);
    sp_mcp_close(mfd);

    /* A guest tool's output helper. */
    uint8_t out[8];
    uint32_t cap = 4;
    int32_t t = sp_tool_output((int32_t)(uintptr_t)out, (int32_t)(uintptr_t)&cap, "123456", 6);
    printf("tool_output_enospc=%d needed=%u\n", t == -SPEAR_ENOSPC, (unsigned)cap);

    /* A log line longer than sp_vlogf's stack buffer. */
    char line[2001];
    memset(line, 'l', 2000);
    line[2000] = 0;
    printf("long_log=%d\n", sp_infof("%s", line));
    printf("bad_level_einval=%d\n", sp_log_str(9, "x") == -SPEAR_EINVAL);
    return 0;
}
