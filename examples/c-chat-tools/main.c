/*
 * c-chat-tools: the C counterpart of examples/chat-tools. It calls the MCP server
 * `fixture` directly, then holds a chat in which the model calls a C function of this
 * guest and a tool of that MCP server, both run by the host.
 *
 * Build (from the repository root; scripts/setup.sh installs clang and wasi-libc):
 *
 *   clang --target=wasm32-wasi -O2 -Wall -Wextra -I guest-sdk/c -Wl,--export-table \
 *       examples/c-chat-tools/main.c -o target/c-chat-tools.wasm
 *
 * Run, offline, on the shipped transcript:
 *
 *   cargo build -p quiver -p quiver-tests --bin quiver --bin fixture-mcp-server
 *   target/debug/quiver run target/c-chat-tools.wasm --task fixtures/tasks/chat.json \
 *       --registry fixtures/registry --config fixtures/quiver.toml
 *
 * Output (stdout):
 *
 *   registry: fixture
 *   mcp add(2, 3) = 5
 *   mcp big(50000): 50000 bytes of text
 *   mcp count = 3
 *   <the model's answer>
 *   tools used: get_weather (guest), mcp__fixture__add (mcp)
 *
 * `mcp count = 3` shows that the big result, which does not fit the first buffer, was
 * fetched again without running the tool again. Errors go to stderr and exit status 1.
 */

/* This guest prints its results; its diagnostics are log lines (sp_*f), shown on stderr. */
#define SPEAR_DISABLE_STDIO_REDIRECT_TO_LOG
#include "spear.h"

#define DEFAULT_QUESTION "What's the weather in Paris, and what is 2+3?"

#define SYSTEM_PROMPT                                                                         \
    "You are a concise assistant. Use the get_weather tool for weather questions and the "   \
    "add tool for arithmetic; never guess what a tool would say. Answer in one or two "      \
    "sentences."

#define WEATHER_TOOL                                                                          \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","                         \
    "\"description\":\"Current weather for a city\",\"parameters\":{\"type\":\"object\","    \
    "\"properties\":{\"city\":{\"type\":\"string\",\"description\":\"City name, e.g. "       \
    "Paris\"}},\"required\":[\"city\"]}}}"

/* The region of memory the host uses for guest tool calls' arguments and results. */
static uint8_t TOOL_ARENA[64 * 1024];

/*
 * The JSON string value that starts at `p` (at its opening quote), unescaped into out
 * (NUL-terminated, cut to cap). Returns the position after the closing quote, or NULL.
 * Enough for this example's inputs: escapes and \uXXXX of the Basic Multilingual Plane.
 */
static const char *json_string(const char *p, const char *end, char *out, size_t cap) {
    size_t n = 0;
    if (p >= end || *p != '"' || cap == 0) {
        return NULL;
    }
    for (p++; p < end && *p != '"'; p++) {
        char c = *p;
        char utf8[3];
        size_t len = 1;
        utf8[0] = c;
        if (c == '\\') {
            if (++p >= end) {
                return NULL;
            }
            switch (*p) {
            case 'n': utf8[0] = '\n'; break;
            case 't': utf8[0] = '\t'; break;
            case 'r': utf8[0] = '\r'; break;
            case 'b': utf8[0] = '\b'; break;
            case 'f': utf8[0] = '\f'; break;
            case 'u': {
                unsigned v = 0;
                for (int i = 0; i < 4; i++) {
                    if (++p >= end) {
                        return NULL;
                    }
                    char h = *p;
                    v = v * 16 + (unsigned)(h >= 'a' ? h - 'a' + 10 : h >= 'A' ? h - 'A' + 10 : h - '0');
                }
                if (v < 0x80) {
                    utf8[0] = (char)v;
                } else if (v < 0x800) {
                    utf8[0] = (char)(0xc0 | (v >> 6));
                    utf8[1] = (char)(0x80 | (v & 0x3f));
                    len = 2;
                } else {
                    utf8[0] = (char)(0xe0 | (v >> 12));
                    utf8[1] = (char)(0x80 | ((v >> 6) & 0x3f));
                    utf8[2] = (char)(0x80 | (v & 0x3f));
                    len = 3;
                }
                break;
            }
            default: utf8[0] = *p; break; /* \" \\ \/ */
            }
        }
        for (size_t i = 0; i < len && n + 1 < cap; i++) {
            out[n++] = utf8[i];
        }
    }
    out[n] = 0;
    return p < end ? p + 1 : NULL;
}

/* The string value of the first `"key":` in [p, end), or NULL. */
static const char *find_string_field(const char *p, const char *end, const char *key, char *out,
                                     size_t cap) {
    size_t key_len = strlen(key);
    for (; p + key_len + 2 < end; p++) {
        if (p[0] != '"' || memcmp(p + 1, key, key_len) != 0 || p[key_len + 1] != '"') {
            continue;
        }
        const char *q = p + key_len + 2;
        while (q < end && (*q == ' ' || *q == ':')) {
            q++;
        }
        if (json_string(q, end, out, cap)) {
            return q;
        }
    }
    return NULL;
}

/* The guest tool get_weather {city}: the same made-up forecast every time. */
static int32_t get_weather(int32_t args_ptr, int32_t args_len, int32_t out_ptr,
                           int32_t out_len_ptr) {
    const char *args = (const char *)(uintptr_t)args_ptr;
    char city[128];
    char result[192];
    if (!find_string_field(args, args + args_len, "city", city, sizeof city) || !city[0]) {
        static const char msg[] = "`city` must be a non-empty string";
        sp_warnf("get_weather: %s", msg);
        return sp_tool_output(out_ptr, out_len_ptr, msg, sizeof msg - 1);
    }
    int n = snprintf(result, sizeof result, "Sunny, 21\xc2\xb0" "C in %s", city);
    if (n < 0 || (size_t)n >= sizeof result) {
        return -SPEAR_EIO;
    }
    sp_debugf("get_weather(%s)", city);
    return sp_tool_output(out_ptr, out_len_ptr, result, (size_t)n);
}

/* Calls an MCP tool and returns its first text block (malloc'd), or NULL after printing
 * why. */
static char *mcp_text(int32_t fd, const char *tool, const char *args, uint32_t *text_len) {
    uint32_t len = 0;
    int32_t rc = 0;
    char *result = (char *)sp_mcp_call_tool_alloc(fd, tool, args, &len, &rc);
    if (!result) {
        fprintf(stderr, "c-chat-tools: mcp_call_tool %s failed: %d\n", tool, (int)rc);
        return NULL;
    }
    char *text = (char *)malloc(len + 1);
    if (!text || !find_string_field(result, result + len, "text", text, len + 1)) {
        fprintf(stderr, "c-chat-tools: %s gave no text: %.200s\n", tool, result);
        free(text);
        free(result);
        return NULL;
    }
    if (text_len) {
        *text_len = (uint32_t)strlen(text);
    }
    free(result);
    return text;
}

/* Direct MCP calls: the registry, one small and one large result, and the call count. */
static int mcp_direct(void) {
    int32_t rc = 0;
    char *registry = (char *)sp_mcp_registry_list_alloc(NULL, &rc);
    if (!registry) {
        fprintf(stderr, "c-chat-tools: mcp_registry_list failed: %d\n", (int)rc);
        return 1;
    }
    char server[64];
    const char *end = registry + strlen(registry);
    printf("registry:");
    for (const char *p = registry;
         (p = find_string_field(p, end, "server_id", server, sizeof server)) != NULL; p++) {
        printf(" %s", server);
    }
    printf("\n");
    free(registry);

    int32_t fd = sp_mcp_open_str("fixture");
    if (fd < 0) {
        fprintf(stderr, "c-chat-tools: mcp_open fixture failed: %d\n", (int)fd);
        return 1;
    }
    uint32_t len = 0;
    char *tools = (char *)sp_mcp_list_tools_alloc(fd, &len, &rc);
    if (!tools) {
        fprintf(stderr, "c-chat-tools: mcp_list_tools failed: %d\n", (int)rc);
        sp_mcp_close(fd);
        return 1;
    }
    sp_infof("fixture tools: %u bytes of JSON", (unsigned)len);
    free(tools);

    char *sum = mcp_text(fd, "add", "{\"a\": 2, \"b\": 3}", NULL);
    char *big = mcp_text(fd, "big", "{\"bytes\": 50000}", &len);
    char *count = mcp_text(fd, "count", NULL, NULL);
    int failed = !sum || !big || !count;
    if (!failed) {
        printf("mcp add(2, 3) = %s\n", sum);
        printf("mcp big(50000): %u bytes of text\n", (unsigned)len);
        printf("mcp count = %s\n", count);
    }
    free(sum);
    free(big);
    free(count);
    sp_mcp_close(fd);
    return failed;
}

/* Prints `name (kind)` for each distinct tool in _spear.tool_calls of the response. */
static void print_tools_used(const char *resp, uint32_t len) {
    const char *end = resp + len;
    const char *spear = strstr(resp, "\"_spear\"");
    const char *calls = spear ? strstr(spear, "\"tool_calls\":[") : NULL;
    char seen[512] = "";
    printf("tools used:");
    if (calls) {
        const char *p = calls + strlen("\"tool_calls\":[");
        while (p < end && *p == '{') {
            const char *close = memchr(p, '}', (size_t)(end - p));
            if (!close) {
                break;
            }
            char name[80] = "?", kind[16] = "?", entry[100];
            find_string_field(p, close, "name", name, sizeof name);
            find_string_field(p, close, "kind", kind, sizeof kind);
            snprintf(entry, sizeof entry, "%s (%s)", name, kind);
            if (!strstr(seen, entry)) {
                printf("%s %s", seen[0] ? "," : "", entry);
                strncat(seen, entry, sizeof seen - strlen(seen) - 1);
            }
            p = close + 1;
            if (p < end && *p == ',') {
                p++;
            }
        }
    }
    printf("%s\n", seen[0] ? "" : " none");
}

static int chat(const char *question) {
    int32_t fd = sp_cchat_create();
    if (fd < 0) {
        fprintf(stderr, "c-chat-tools: cchat_create failed: %d\n", (int)fd);
        return 1;
    }
    int32_t rc = 0;
    if ((rc = sp_cchat_write_msg_str(fd, "system", SYSTEM_PROMPT)) < 0 ||
        (rc = sp_cchat_write_tool(fd, get_weather, WEATHER_TOOL)) < 0 ||
        (rc = sp_cchat_set_param_u32(fd, "tool_arena_ptr", (uint32_t)(uintptr_t)TOOL_ARENA)) < 0 ||
        (rc = sp_cchat_set_param_u32(fd, "tool_arena_len", (uint32_t)sizeof TOOL_ARENA)) < 0 ||
        (rc = sp_cchat_set_param_value_json(fd, "mcp.enabled", "true")) < 0 ||
        (rc = sp_cchat_set_param_value_json(fd, "mcp.server_ids", "[\"fixture\"]")) < 0 ||
        (rc = sp_cchat_write_msg_str(fd, "user", question)) < 0) {
        fprintf(stderr, "c-chat-tools: setting up the chat failed: %d\n", (int)rc);
        sp_cchat_close(fd);
        return 1;
    }

    int32_t resp_fd = sp_cchat_send(fd, AUTO_TOOL_CALL);
    if (resp_fd < 0) {
        fprintf(stderr, "c-chat-tools: cchat_send failed: %d\n", (int)resp_fd);
        sp_cchat_close(fd);
        return 1;
    }
    uint32_t len = 0;
    char *resp = (char *)sp_cchat_recv_alloc(resp_fd, &len);
    char *metrics = (char *)sp_cchat_get_metrics_alloc(resp_fd, NULL, &rc);
    if (metrics) {
        sp_infof("chat metrics: %s", metrics);
    } else {
        sp_warnf("no chat metrics: %d", (int)rc);
    }
    free(metrics);
    sp_cchat_close(resp_fd);
    sp_cchat_close(fd);
    if (!resp) {
        fprintf(stderr, "c-chat-tools: cchat_recv failed\n");
        return 1;
    }

    int status = 0;
    const char *choices = strstr(resp, "\"choices\"");
    char *text = (char *)malloc(len + 1);
    if (!text) {
        status = 1;
    } else if (!choices) {
        fprintf(stderr, "c-chat-tools: chat failed: %s\n", resp);
        status = 1;
    } else if (find_string_field(choices, resp + len, "content", text, len + 1)) {
        printf("%s\n", text);
    } else {
        printf("(the model gave no text answer)\n");
    }
    if (status == 0) {
        print_tools_used(resp, len);
    }
    free(text);
    free(resp);
    return status;
}

int main(int argc, char **argv) {
    const char *question = argc > 1 ? argv[1] : DEFAULT_QUESTION;
    int64_t started = sp_time_now_ms();
    if (mcp_direct() != 0 || chat(question) != 0) {
        return 1;
    }
    sp_infof("c-chat-tools done in %lld ms", (long long)(sp_time_now_ms() - started));
    return 0;
}
