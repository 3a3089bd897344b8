/* SPDX-License-Identifier: Apache-2.0 */
/* Links the per-header translation units together. */
#include <zoffload/zoffload.h>

int main(void)
{
    return zo_version() == ZO_VERSION_NUMBER ? 0 : 1;
}
