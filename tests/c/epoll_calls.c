/* Three MCP calls in flight, waited for with SPEAR's sp_ep_* helpers: each `slow` call
 * sleeps 300 ms on the fixture server, so they overlap when the host runs them at once.
 * Prints each answer in the order the calls became ready, then the time all took. */
#define SPEAR_DISABLE_STDIO_REDIRECT_TO_LOG
#include <spear.h>

int main(void) {
    int32_t fd = sp_mcp_open_str("fixture");
    if (fd < 0) {
        fprintf(stderr, "mcp_open: %d\n", fd);
        return 1;
    }
    int32_t ep = sp_ep_create();
    if (ep < 0 || sp_fd_set_nonblock(ep, 1) != 0) {
        fprintf(stderr, "epoll: %d\n", ep);
        return 1;
    }
    int64_t started = sp_time_now_ms();
    int32_t calls[3];
    for (int i = 0; i < 3; i++) {
        calls[i] = sp_mcp_call_start_str(fd, "slow", "{\"ms\":300}");
        if (calls[i] < 0 || sp_ep_ctl(ep, SPEAR_EP_CTL_ADD, calls[i], SPEAR_EPOLLIN) != 0) {
            fprintf(stderr, "call %d: %d\n", i, calls[i]);
            return 1;
        }
    }
    int left = 3;
    while (left > 0) {
        sp_ep_event_t events[4];
        int32_t n = sp_ep_wait_events(ep, events, 4, -1);
        if (n < 0) {
            fprintf(stderr, "wait: %d\n", n);
            return 1;
        }
        for (int32_t i = 0; i < n; i++) {
            uint32_t len = 0;
            int32_t rc = 0;
            uint8_t *answer = sp_mcp_call_recv_alloc(events[i].fd, &len, &rc);
            if (!answer) {
                fprintf(stderr, "recv: %d\n", rc);
                return 1;
            }
            printf("%s\n", (const char *)answer);
            free(answer);
            sp_ep_ctl(ep, SPEAR_EP_CTL_DEL, events[i].fd, 0);
            sp_mcp_close(events[i].fd);
            left--;
        }
    }
    printf("took %lld ms\n", (long long)(sp_time_now_ms() - started));
    sp_ep_close(ep);
    sp_mcp_close(fd);
    return 0;
}
